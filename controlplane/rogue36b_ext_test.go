package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestRogue36BAnAgentCannotHoldManyCallsWaitingForTheirBodies: a rogue
// agent with a valid credential opens unary calls whose bodies it never
// sends (HEADERS without END_STREAM), 200 on each of four connections of
// its own. Each call was admitted from its headers, charged one request,
// and its handler waited for the body until --read-timeout (30 s by
// default): 250 such calls on each of the connections its lineage may
// hold (half of --max-connections), as many as its budget paid for —
// some 320,000 handlers at the default rate, each a goroutine and its
// stream. Now a lineage holds at most --max-streams-per-lineage calls
// whose bodies have not all arrived, and each node controlplane.BodyReserve
// more of its own (a sibling of the rogue, and another lineage, are still
// served); past them a call is refused resource_exhausted from its headers.
// Measured by the goroutines the server's connections hold (wide margin)
// and the rogue's calls answered, never by time.
func TestRogue36BAnAgentCannotHoldManyCallsWaitingForTheirBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the goroutine measurement; make test and CI run them.")
	}
	const share = 16
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst = 1, 100000 // no refill, and plenty
		cfg.Conn.MaxStreamsPerLineage = share
		cfg.Conn.ReadTimeout = time.Hour // the bodies are not cut short
	})
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	rogueC := srv.Clients(root.Credential)
	sibling := spawn(t, rogueC, root.Node.NodeId, "sibling")
	siblingC := srv.Clients(sibling.Credential)
	other := register(t, admin, "other")
	otherC := srv.Clients(other.Credential)
	addr := hostOf(t, srv.URL)
	// The sibling's signal watch, a stream whose request arrived whole,
	// holds no call waiting for its body.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := siblingC.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	siblingID := "agent:" + sibling.Node.NodeId
	testserver.WaitFor(t, closeWait, "the sibling's watch to open", func() bool { return srv.OpenStreams(siblingID) == 1 })
	if own, _ := srv.AwaitedBodies(siblingID, ""); own != 0 {
		t.Fatalf("the sibling's open watch counts as %d calls waiting for their bodies", own)
	}
	c0 := srv.ConnGoroutines()

	const conns, calls = 4, 200
	rogues := newFloodRogues(t, addr, nil, conns)
	floodEach(t, rogues, func(r *floodRogue) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for range calls {
			if _, err := r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", root.Credential, false); err != nil {
				return err
			}
		}
		return nil
	})
	// Every call past what the lineage may hold is answered (its refusal,
	// or a reset when too many refusals wait on the connection).
	held := share + controlplane.BodyReserve
	answered := func() int64 {
		n := int64(0)
		for _, r := range rogues {
			n += r.ended.Load() + r.rsts.Load()
		}
		return n
	}
	last, since := int64(-1), time.Now()
	for answered() < conns*calls-int64(held) {
		if n := answered(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > closeWait {
			t.Fatalf("%d of the rogue's %d calls without a body answered, %d goroutines held by the server's connections (%d before): the rest wait for their bodies", n, conns*calls, srv.ConnGoroutines(), c0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each connection's own goroutines (its serving loop, its reader),
	// and those held calls: a wide margin, far below conns*calls.
	rogueID := "agent:" + root.Node.NodeId
	own, shared := srv.AwaitedBodies(rogueID, root.Node.NodeId)
	g := srv.ConnGoroutines()
	t.Logf("%d of %d calls answered; %d wait for their bodies (%d of the lineage's share); the server's connections hold %d goroutines (%d before)", answered(), conns*calls, own, shared, g, c0)
	if own != held || shared != share {
		t.Errorf("%d of the rogue's calls wait for their bodies, %d of its lineage's share: want %d and %d", own, shared, held, share)
	}
	if g > c0+held+conns*8+50 {
		t.Errorf("the server's connections hold %d goroutines (%d before) with the rogue's calls waiting for their bodies; at most %d calls may wait", g, c0, held)
	}
	// Its sibling (from its own reserve) and another lineage are served;
	// the rogue's own next call is told why it is refused.
	if err := whoAmI(siblingC); err != nil {
		t.Errorf("the rogue's sibling's call: %v", err)
	}
	if err := whoAmI(otherC); err != nil {
		t.Errorf("another lineage's call: %v", err)
	}
	_, err = rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "bodies") {
		t.Errorf("the rogue's own call with %d calls waiting for their bodies: %v, want resource_exhausted naming the calls waiting for their bodies", held, err)
	}
	// Once its connections close, what they held is given back.
	for _, r := range rogues {
		_ = r.c.Close()
	}
	testserver.WaitFor(t, closeWait, "the rogue's calls to be given back", func() bool {
		_, err := rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
		return err == nil
	})
	if own, shared := srv.AwaitedBodies(rogueID, root.Node.NodeId); own != 0 || shared != 0 {
		t.Errorf("with its connections closed and its call answered, %d of the rogue's calls still count as waiting for their bodies (%d of the lineage's share)", own, shared)
	}
}
