package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The tenth rogue pass: what the ninth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP/2, real JWTs,
// the manual clock).

// TestATerminatedRogueLosesItsOpenStreams: a rogue opens the streams an
// agent may open besides its session — the revocation feed, a lease
// channel it keeps quiet — and is then aborted by an operator. Its credential is dead: a new call with it
// is refused. But only the session was told: every other stream went on
// serving the dead credential for as long as the rogue answered pings —
// reading its lineage's revocations after its own termination, holding
// its stream slots, and keeping its connections from ever idling out. Each
// stream now ends, unauthenticated, once the node is terminated.
func TestATerminatedRogueLosesItsOpenStreams(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	spawn(t, rogue, root.Node.NodeId, "child")

	feed, ch := openFeedAndChannel(ctx, t, rogue)
	if err := ch.Send(&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "job-none", LeaseId: "l_none", LeaseGeneration: 1, RenewSequence: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Receive(); err != nil { // the channel is open and serving
		t.Fatalf("the rogue's channel: %v", err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's two streams to be counted", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 2
	})

	op := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, time.Second)
	testserver.WaitFor(t, 20*time.Second, "the operator's abort to end", func() bool {
		clk.Advance(time.Second) // past each of its one-second deadlines
		return getTermination(t, admin, op.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if err := whoAmI(rogue); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a new call with the terminated rogue's credential: %v, want unauthenticated", err)
	}

	for feed.Receive() {
	}
	if connect.CodeOf(feed.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the terminated rogue's revocation feed ended with %v, want unauthenticated", feed.Err())
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := ch.Receive(); err != nil {
				ended <- err
				return
			}
		}
	}()
	var chErr error
	select {
	case chErr = <-ended:
	case <-time.After(20 * time.Second): // a guard against a hang, not a timing
		t.Fatal("the terminated rogue's quiet lease channel is still open")
	}
	if connect.CodeOf(chErr) != connect.CodeUnauthenticated {
		t.Fatalf("the terminated rogue's quiet lease channel ended with %v, want unauthenticated", chErr)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's stream slots to be given back", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 0
	})
}

// tryOrEnded is try on a channel the server may have ended: a message it
// can no longer send, or whose answer never comes, returns the error the
// stream ended with ("code: message") instead of failing the test.
func (c *channel) tryOrEnded(t *testing.T, m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string) {
	t.Helper()
	c.next++
	m.CorrelationId = c.next
	ended := func() string {
		for {
			if _, err := c.stream.Receive(); err != nil {
				return connect.CodeOf(err).String() + ": " + err.Error()
			}
		}
	}
	if err := c.stream.Send(m); err != nil {
		return nil, nil, ended()
	}
	resp, err := c.stream.Receive()
	if err != nil {
		return nil, nil, connect.CodeOf(err).String() + ": " + err.Error()
	}
	if resp.CorrelationId != m.CorrelationId {
		t.Fatalf("answer carries correlation id %d, want %d", resp.CorrelationId, m.CorrelationId)
	}
	return resp.Lease, resp.Decision, resp.Error
}

// TestARogueCannotListItsLargeSubtreeForThePriceOfOneCall: a rogue whose
// tree holds thousands of nodes lists its own subtree over and over. The
// listing of a subtree is not paged: each call reads and sends every node
// of it, yet cost one request of the lineage's budget — where listing
// every node of the server in pages costs one request per thousand. A
// tree of a hundred thousand nodes (a few seconds of a lineage's spawns at
// the default rate) made each call a hundred pages of work, at the rate
// meant for one. A subtree listing now costs a request per thousand nodes
// it returns (as a batch of n spawns costs n): a lineage's budget buys as
// many nodes read one way as the other.
func TestARogueCannotListItsLargeSubtreeForThePriceOfOneCall(t *testing.T) {
	srv, root, refill := bigRogueTree(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := srv.Clients(root.Credential)
	refill()
	listings := 0
	var refusal error
	for refusal == nil && listings <= bigBurst {
		resp, err := rogue.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{}))
		switch {
		case err != nil:
			refusal = err
		case len(resp.Msg.Nodes) != 2049:
			t.Fatalf("the rogue's listing of its subtree has %d nodes, want 2049", len(resp.Msg.Nodes))
		default:
			listings++
		}
	}
	// 2,049 nodes are three pages of a thousand: a burst of 300 buys 100.
	if listings != bigBurst/3 {
		t.Fatalf("the rogue listed its 2,049-node subtree %d times on a budget of %d requests, want %d (three requests each); refused: %v", listings, bigBurst, bigBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
	// Another lineage, and a small subtree, pay one request as before.
	other := register(t, admin, "other")
	if _, err := srv.Clients(other.Credential).Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{})); err != nil {
		t.Fatalf("another lineage's listing: %v", err)
	}
}

// bigBurst is the rate budget's burst in the big-tree tests (at 100/s).
const bigBurst = 300

// bigRogueTree starts a server whose rate budgets are bigBurst requests at
// 100 a second, and registers a rogue root to which the operator (on its
// own budget) gives 2,048 children: a subtree of 2,049 nodes, three pages
// of a thousand. refill fills every budget (the manual clock).
func bigRogueTree(t *testing.T) (srv *testserver.Server, root *tetherv1.RegisterRootResponse, refill func()) {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv = testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 100, bigBurst })
	admin := srv.AdminClients()
	refill = func() { clk.Advance(2 * bigBurst / 100 * time.Second) } // a full bucket at 100/s
	root = register(t, admin, "rogue")
	for b := range 8 {
		refill()
		children := make([]*tetherv1.SpawnBatchChild, 256)
		for i := range children {
			children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("w-%d-%d", b, i)}
		}
		if _, err := admin.Agent.SpawnBatch(context.Background(), connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: root.Node.NodeId, Children: children})); err != nil {
			t.Fatal(err)
		}
	}
	return srv, root, refill
}

// TestARogueCannotPageItsLargeSubtreesGrantsForThePriceOfOneCall: the
// same rogue lists the grants held in its subtree. Each page of that
// listing reads every node of the subtree (and what each holds) to find
// the page's grants, yet cost one request: a page of no grants at all was
// 2,049 nodes read for one request. It now costs a request per thousand
// nodes read, as ListNodes does.
func TestARogueCannotPageItsLargeSubtreesGrantsForThePriceOfOneCall(t *testing.T) {
	srv, root, refill := bigRogueTree(t)
	ctx := context.Background()
	rogue := srv.Clients(root.Credential)
	refill()
	listings := 0
	var refusal error
	for refusal == nil && listings <= bigBurst {
		if _, err := rogue.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{SubtreeNodeId: root.Node.NodeId})); err != nil {
			refusal = err
		} else {
			listings++
		}
	}
	if listings != bigBurst/3 {
		t.Fatalf("the rogue listed its 2,049-node subtree's grants %d times on a budget of %d requests, want %d (three requests each); refused: %v", listings, bigBurst, bigBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
}

// openFeedAndChannel opens an agent's revocation feed (and reads its first
// message) and a lease Channel, both closed when the test ends: the
// streams a stopped rogue would keep.
func openFeedAndChannel(ctx context.Context, t *testing.T, agent *testserver.Clients) (*connect.ServerStreamForClient[tetherv1.WatchRevocationsResponse], *connect.BidiStreamForClient[tetherv1.ChannelRequest, tetherv1.ChannelResponse]) {
	t.Helper()
	feed, err := agent.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { feed.Close() })
	if !feed.Receive() {
		t.Fatalf("the rogue's revocation feed: %v", feed.Err())
	}
	ch := agent.Lease.Channel(ctx)
	t.Cleanup(func() {
		ch.CloseRequest()
		ch.CloseResponse()
	})
	return feed, ch
}
