package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
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
	limits := tree.Limits{MaxDepth: 3, MaxChildren: 2, MaxLabels: 4}
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
	// Its lineage's budget is spent, but a session is upkeep: it opens on
	// the node's own reserve (controlplane.UpkeepReserveBurst), and its
	// heartbeats run on it until that is spent too.
	if _, err = stream.Receive(); err != nil {
		t.Fatalf("a limited agent's session, on its node's reserve: %v", err)
	}
	acks := 0
	for err == nil {
		_ = stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}})
		var m *tetherv1.SessionResponse
		for err == nil {
			if m, err = stream.Receive(); err == nil && m.GetHeartbeatAck() != nil {
				acks++
				break
			}
		}
		if acks > 100 {
			t.Fatal("the reserve does not run out")
		}
	}
	if acks != controlplane.UpkeepReserveBurst-1 {
		t.Fatalf("%d heartbeats on the reserve, want %d (its burst less the session's opening)", acks, controlplane.UpkeepReserveBurst-1)
	}
	wantLimit(t, "a limited agent's session past its reserve", err, connect.CodeResourceExhausted, "rate limit")
}

// retryAfter is a refusal's Retry-After header; the RetryInfo detail must
// say the same.
func retryAfter(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.RetryInfo); ok && info.RetryDelay.AsDuration() > 0 {
				return ce.Meta().Get("Retry-After")
			}
		}
	}
	return "no RetryInfo detail"
}

func whoAmI(c *testserver.Clients) error {
	_, err := c.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	return err
}

// TestRateLimitIsSharedByTheLineage plays a swarm that spawns children to
// multiply its rate: a root and its 20 children share one budget, every
// stream message spends from it, and a batch on a lease Channel costs
// one per message it carries.
func TestRateLimitIsSharedByTheLineage(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	const burst = 6
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, burst })
	ctx := context.Background()
	admin := srv.AdminClients()
	refill := func() { clk.Advance(10 * time.Second) } // a full bucket at 1/s
	root := register(t, admin, "swarm")
	rootClients := srv.Clients(root.Credential)
	callers := []*testserver.Clients{rootClients}
	for i := range 20 {
		refill()
		callers = append(callers, srv.Clients(spawn(t, rootClients, root.Node.NodeId, fmt.Sprintf("child-%d", i)).Credential))
	}

	// One instant, 21 agents of one lineage: one burst between them all.
	refill()
	allowed := 0
	var refusal error
	for _, c := range callers {
		if err := whoAmI(c); err == nil {
			allowed++
		} else if refusal == nil {
			refusal = err
		}
	}
	if allowed != burst {
		t.Fatalf("21 agents of one lineage made %d calls in one instant, want the lineage's burst of %d", allowed, burst)
	}
	wantLimit(t, "the lineage past its burst", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId, "retry in 1s")
	if got := retryAfter(refusal); got != "1" {
		t.Fatalf("Retry-After = %q, want 1", got)
	}
	// Another tree has its own budget, and so does the admin.
	other := register(t, admin, "other")
	if err := whoAmI(srv.Clients(other.Credential)); err != nil {
		t.Fatalf("another lineage was limited by the swarm's: %v", err)
	}

	// A session: opening it costs one call, every heartbeat one more.
	refill()
	session := rootClients.Agent.Session(ctx)
	defer func() { _ = session.CloseRequest(); _ = session.CloseResponse() }()
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: root.Node.NodeId}}}); err != nil {
		t.Fatal(err)
	}
	acks := 0
	var sessionErr error
	for sessionErr == nil {
		_ = session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}})
		for {
			m, err := session.Receive()
			if err != nil {
				sessionErr = err
				break
			}
			if m.GetHeartbeatAck() != nil {
				acks++
				break
			}
		}
		if acks > 100 {
			t.Fatal("a session's heartbeats are not rate limited")
		}
	}
	// The node's own reserve for its upkeep (a heartbeat is upkeep) comes
	// after the lineage's budget.
	if acks != burst-1+controlplane.UpkeepReserveBurst {
		t.Fatalf("%d heartbeats answered, want %d (the burst less the session's opening, then the node's reserve)", acks, burst-1+controlplane.UpkeepReserveBurst)
	}
	wantLimit(t, "a heartbeat past the lineage's burst", sessionErr, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)

	// A lease Channel: a batch of n messages costs n (+1 for the stream
	// message that carries it, after the first).
	refill()
	progress := func(id uint64) *tetherv1.ChannelRequest {
		return &tetherv1.ChannelRequest{CorrelationId: id, Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: "job", ProgressValue: "1"}}}
	}
	channel := callers[1].Lease.Channel(ctx)
	defer func() { _ = channel.CloseRequest(); _ = channel.CloseResponse() }()
	first := progress(1)
	first.Batch = []*tetherv1.ChannelRequest{progress(2), progress(3)} // open 1 + batch 2: 3 of 6
	if err := channel.Send(first); err != nil {
		t.Fatal(err)
	}
	answered := 0
	for answered < 3 {
		m, err := channel.Receive()
		if err != nil {
			t.Fatalf("a batch within the budget: %v", err)
		}
		answered += 1 + len(m.Batch)
	}
	big := progress(10) // 1 for the message + 20 for its batch: past the 3 left, and past the node's reserve
	for i := range 20 {
		big.Batch = append(big.Batch, progress(uint64(11+i)))
	}
	_ = channel.Send(big)
	for {
		m, err := channel.Receive()
		if err != nil {
			wantLimit(t, "a batch past the lineage's budget", err, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId, "batch of 20")
			break
		}
		if m.CorrelationId >= 10 {
			t.Fatalf("a message of the refused batch was judged: %v", m)
		}
	}
}

// TestRequestsWithoutCredentialAreLimitedPerAddress: a source that keeps
// sending bad tokens is refused before its next token is verified, while a
// caller whose token the server already verified goes on.
func TestRequestsWithoutCredentialAreLimitedPerAddress(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 1 })
	ctx := context.Background()
	admin := srv.AdminClients()
	created, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_VIEWER}))
	if err != nil {
		t.Fatal(err)
	}
	// Their own connection, bound to nobody: a connection bound to a live
	// caller (the admin's) pays from that caller's budget (rogue32e test).
	anon := testserver.H2CClient()
	bad := testserver.NewClients(anon, srv.URL, "not-a-token")
	none := testserver.NewClients(anon, srv.URL, "")
	for i, c := range []*testserver.Clients{bad, none} {
		if err := whoAmI(c); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("bad request %d within the burst of 2: %v, want unauthenticated", i+1, err)
		}
	}
	err = whoAmI(bad)
	wantLimit(t, "the third bad request", err, connect.CodeResourceExhausted, "without a valid credential from 127.0.0.1", "retry in 1s")
	if retryAfter(err) != "1" {
		t.Fatalf("Retry-After = %q", retryAfter(err))
	}
	// A token already verified is not held up by its neighbours' failures,
	// nor one the server minted (remembered as verified: rogue33b test);
	// one never seen from this address waits its turn (minted by the key
	// ring alone, as another replica or the server before a restart would
	// have minted it).
	if err := whoAmI(admin); err != nil {
		t.Fatalf("the admin, verified before: %v", err)
	}
	if err := whoAmI(testserver.NewClients(testserver.H2CClient(), srv.URL, created.Msg.Token)); err != nil {
		t.Fatalf("a token the server minted (CreateToken): %v", err)
	}
	unseen, _, _, err := srv.Issuer().MintOperator("viewer-elsewhere", auth.RoleViewer, clk.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	viewer := testserver.NewClients(anon, srv.URL, unseen)
	wantLimit(t, "an unverified token from the flooded address", whoAmI(viewer), connect.CodeResourceExhausted, "without a valid credential")
	clk.Advance(2 * time.Second)
	if err := whoAmI(viewer); err != nil {
		t.Fatalf("after the address's bucket refilled: %v", err)
	}
}

// TestOpenStreamsPerCaller: one principal cannot hold more than its share
// of quiet streams; the slot frees when a stream ends.
func TestOpenStreamsPerCaller(t *testing.T) {
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Conn.MaxStreamsPerCaller = 3 })
	admin := srv.AdminClients()
	hoarder := register(t, admin, "hoarder")
	agent := srv.Clients(hoarder.Credential)
	open := func(c *testserver.Clients) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := c.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err == nil && !stream.Receive() {
			err = stream.Err()
		}
		if err != nil {
			cancel()
			return nil, err
		}
		return cancel, nil
	}
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i := range 3 {
		cancel, err := open(agent)
		if err != nil {
			t.Fatalf("stream %d of 3: %v", i+1, err)
		}
		cancels = append(cancels, cancel)
	}
	_, err := open(agent)
	wantLimit(t, "a fourth stream", err, connect.CodeResourceExhausted, "agent:"+hoarder.Node.NodeId, "3 open streams")
	if cancel, err := open(srv.Clients(register(t, admin, "neighbour").Credential)); err != nil {
		t.Fatalf("another agent was limited by the hoarder: %v", err)
	} else {
		cancels = append(cancels, cancel)
	}
	cancels[0]()
	testserver.WaitFor(t, 10*time.Second, "the closed stream to free its slot", func() bool { return srv.OpenStreams("agent:"+hoarder.Node.NodeId) == 2 })
	if cancel, err := open(agent); err != nil {
		t.Fatalf("after one stream closed: %v", err)
	} else {
		cancels = append(cancels, cancel)
	}
}
