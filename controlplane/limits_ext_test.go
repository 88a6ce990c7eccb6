package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Every bound on what one caller can make the control plane hold or do is
// refused with a clear Connect code and a message that names the limit,
// and the refusal changes nothing.

// wantLimit checks a refusal's code and that its message names the limit.
func wantLimit(t *testing.T, what string, err error, code connect.Code, names ...string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Fatalf("%s: message %q does not name %q", what, err, n)
		}
	}
	t.Logf("%s: %v", what, err)
}

func TestRequestSizeLimit(t *testing.T) {
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.MaxRequestBytes = 64 << 10 })
	admin := srv.AdminClients()
	ctx := context.Background()
	agent := register(t, admin, "small") // under the limit, a request passes
	big := map[string]string{"k": strings.Repeat("x", 100<<10)}
	_, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "big", Labels: big}))
	wantLimit(t, "a 100 KiB request against a 64 KiB limit", err, connect.CodeResourceExhausted, fmt.Sprint(64<<10))

	// Compression does not get around it: the limit applies to the
	// decompressed message (a few KiB of gzip that inflate past it).
	gz := testserver.NewClients(srv.HTTP, srv.URL, srv.Admin, connect.WithSendGzip())
	_, err = gz.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bomb", Labels: big}))
	wantLimit(t, "a gzip request inflating past the limit", err, connect.CodeResourceExhausted, fmt.Sprint(64<<10))

	// The same limit bounds each message of a stream.
	stream := srv.Clients(agent.Credential).Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	_ = stream.Send(&tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: "j", ProgressValue: strings.Repeat("x", 100<<10)}}})
	_, err = stream.Receive()
	wantLimit(t, "a 100 KiB stream message", err, connect.CodeResourceExhausted, fmt.Sprint(64<<10))
	assertNodeCount(t, admin, 1)
}

func TestTreeDepthAndFanOutLimits(t *testing.T) {
	limits := supervisor.Limits{MaxDepth: 3, MaxChildren: 2, MaxLabels: 4}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.TreeLimits = limits })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")

	// Depth: a root is at depth 0; its descendants down to depth 3 exist.
	parent := root.Node.NodeId
	for depth := 1; depth <= limits.MaxDepth; depth++ {
		parent = spawn(t, admin, parent, fmt.Sprintf("depth-%d", depth)).Node.NodeId
	}
	_, err := admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: "too-deep"}))
	wantLimit(t, "a spawn below the maximum depth", err, connect.CodeResourceExhausted, "maximum tree depth 3", parent)

	// Fan-out: two children per node, the third is refused — also when
	// the parent agent asks with its own credential.
	spawn(t, admin, root.Node.NodeId, "second")
	_, err = srv.Clients(root.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Node.NodeId, Name: "third"}))
	wantLimit(t, "a third child", err, connect.CodeResourceExhausted, "already has 2 children, the maximum per node", root.Node.NodeId)

	// Labels per node.
	labels := map[string]string{}
	for i := range limits.MaxLabels + 1 {
		labels[fmt.Sprintf("k%d", i)] = "v"
	}
	_, err = admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "labelled", Labels: labels}))
	wantLimit(t, "five labels", err, connect.CodeResourceExhausted, "labels", "at most 4")
	assertNodeCount(t, admin, 1+limits.MaxDepth+1)
}

func TestScopesPerGrantLimit(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	child := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "child")
	scopes := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("tool:t%d", i)
		}
		return out
	}
	_, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: scopes(capability.MaxScopes + 1), Ttl: durationpb.New(time.Hour)}))
	wantLimit(t, "a root grant with one scope too many", err, connect.CodeInvalidArgument, fmt.Sprintf("%d scopes exceed the limit of %d", capability.MaxScopes+1, capability.MaxScopes))

	full, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: scopes(capability.MaxScopes), Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatalf("a root grant with exactly %d scopes: %v", capability.MaxScopes, err)
	}
	// A delegation cannot carry more either, even of scopes its parent has.
	_, err = srv.Clients(root.Credential).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{
		ParentGrantId: full.Msg.Grant.GrantId, HolderNodeId: child.Node.NodeId, Scopes: append(scopes(capability.MaxScopes), "tool:t0"),
	}))
	wantLimit(t, "a delegation with one scope too many", err, connect.CodeInvalidArgument, fmt.Sprintf("exceed the limit of %d", capability.MaxScopes))
	if grants := allGrants(t, admin, &tetherv1.ListGrantsRequest{}); len(grants) != 1 {
		t.Fatalf("%d grants after the refusals, want the one accepted", len(grants))
	}
}

func TestRateLimitPerCaller(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 3 })
	ctx := context.Background()
	admin := srv.AdminClients()
	who := func(c *testserver.Clients) error {
		_, err := c.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		return err
	}
	for i := range 3 {
		if err := who(admin); err != nil {
			t.Fatalf("request %d within the burst of 3: %v", i+1, err)
		}
	}
	err := who(admin)
	wantLimit(t, "the fourth request in the same instant", err, connect.CodeResourceExhausted, "rate limit", "operator:admin", "retry in 1s")

	// Each caller has its own bucket: an agent is not slowed by the admin,
	// and a runaway agent does not slow the admin down either.
	resp, err := srv.Clients(srv.Admin).Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "agent"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the admin's fifth request: %v, want resource_exhausted", err)
	}
	clk.Advance(3 * time.Second) // the admin's bucket refills
	resp, err = admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "agent"}))
	if err != nil {
		t.Fatalf("after the bucket refilled: %v", err)
	}
	agent := srv.Clients(resp.Msg.Credential)
	for i := range 3 {
		if err := who(agent); err != nil {
			t.Fatalf("the agent's request %d: %v", i+1, err)
		}
	}
	wantLimit(t, "the agent's fourth request", who(agent), connect.CodeResourceExhausted, "agent:"+resp.Msg.Node.NodeId)
	if err := who(admin); err != nil {
		t.Fatalf("the admin while the agent is limited: %v", err)
	}
	// Streams count once, when opened.
	stream := agent.Agent.Session(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	_ = stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: resp.Msg.Node.NodeId}}})
	_, err = stream.Receive()
	wantLimit(t, "a limited agent's session", err, connect.CodeResourceExhausted, "rate limit")
}
