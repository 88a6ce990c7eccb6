package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARogueSwarmHoldsOnlyItsLineagesShareOfTheStreams: open streams were
// bounded per caller only, so a rogue that spawned children and had each
// hold its cap of quiet streams (revocation feeds, watches, lease
// channels) held N times the cap — bounded only by its lineage's
// connections times the streams of a connection, a large share of the
// server's goroutines and memory. Now the lineage's streams together are
// bounded (--max-streams-per-lineage), refused resource_exhausted naming
// the rogue's own lineage and no other tree; past the share each node
// still opens its own signal stream from a small reserve of its own
// (controlplane.SignalStreamReserve), so a well-behaved sibling hears its
// stop and confirms its exit (and a couple of other streams from another,
// controlplane.StreamReserve: rogue16srv); another lineage is not limited by the
// rogue's streams; and a stream that ends frees a place of the share.
func TestARogueSwarmHoldsOnlyItsLineagesShareOfTheStreams(t *testing.T) {
	const perCaller, share, rogues = 12, 6, 4
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Conn.MaxStreamsPerCaller = perCaller
		cfg.Conn.MaxStreamsPerLineage = share
	})
	admin := srv.AdminClients()
	other := register(t, admin, "neighbour")
	root := register(t, admin, "rogue")
	rootC := srv.Clients(root.Credential)
	nodes := []string{root.Node.NodeId}
	creds := []string{root.Credential}
	for i := range rogues - 1 {
		child := spawn(t, rootC, root.Node.NodeId, "rogue-child-"+string(rune('a'+i)))
		nodes = append(nodes, child.Node.NodeId)
		creds = append(creds, child.Credential)
	}
	quiet := spawn(t, rootC, root.Node.NodeId, "well-behaved")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	// revocations and signals open a stream and wait for its first
	// message (the server's answer that it was admitted).
	revocations := func(c *testserver.Clients) (func(), error) {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.Capability.WatchRevocations(sctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err == nil && !stream.Receive() {
			err = stream.Err()
		}
		if err != nil {
			scancel()
			return nil, err
		}
		return func() { scancel(); _ = stream.Close() }, nil
	}
	signals := func(c *testserver.Clients) (*connect.ServerStreamForClient[tetherv1.WatchSignalsResponse], func(), error) {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.Agent.WatchSignals(sctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
		if err == nil && !stream.Receive() {
			err = stream.Err()
		}
		if err != nil {
			scancel()
			return nil, nil, err
		}
		return stream, func() { scancel(); _ = stream.Close() }, nil
	}
	refusedForTheLineage := func(what string, err error) {
		t.Helper()
		wantLimit(t, what, err, connect.CodeResourceExhausted, "lineage "+root.Node.NodeId, "--max-streams-per-lineage")
		for _, foreign := range []string{other.Node.NodeId, quiet.Node.NodeId} {
			if strings.Contains(err.Error(), foreign) {
				t.Fatalf("%s: the refusal %q names %s, a node the caller did not ask about", what, err, foreign)
			}
		}
	}

	// Every rogue node opens revocation feeds up to its own cap: the
	// lineage holds its share and each node its own reserve of other
	// streams (controlplane.StreamReserve), the rest are refused.
	admitted := 0
	byNode := map[string][]func(){}
	for n, cred := range creds {
		c := srv.Clients(cred)
		for range perCaller {
			closer, err := revocations(c)
			if err != nil {
				refusedForTheLineage("a rogue's revocation feed past the lineage's share", err)
				continue
			}
			admitted++
			closers = append(closers, closer)
			byNode[nodes[n]] = append(byNode[nodes[n]], closer)
		}
	}
	if want := share + rogues*controlplane.StreamReserve; admitted != want {
		t.Fatalf("the rogue's %d nodes opened %d revocation feeds, want the lineage's share of %d and their reserves, %d (each node's cap is %d)", rogues, admitted, share, want, perCaller)
	}
	// The well-behaved sibling, its lineage's share held by the rogues,
	// still hears its stop and confirms its exit.
	quietC := srv.Clients(quiet.Credential)
	var quietFeeds []func()
	for k := range controlplane.StreamReserve + 1 {
		closer, err := revocations(quietC)
		if k == controlplane.StreamReserve {
			if err == nil {
				t.Fatal("the sibling opened a revocation feed past its lineage's share and its node's reserve")
			}
			wantLimit(t, "the sibling's feed past its node's reserve", err, connect.CodeResourceExhausted, "lineage "+root.Node.NodeId, "--max-streams-per-lineage")
			continue
		}
		if err != nil {
			t.Fatalf("the sibling's feed %d of its node's reserve of %d: %v", k+1, controlplane.StreamReserve, err)
		}
		quietFeeds = append(quietFeeds, closer)
	}
	stream, quietClose, err := signals(quietC)
	if err != nil {
		t.Fatalf("the well-behaved sibling's signal stream, its lineage's share held by the rogues: %v", err)
	}
	defer quietClose()
	if stream.Msg().GetOpened().GetNode().GetNodeId() != quiet.Node.NodeId {
		t.Fatalf("the sibling's first message %v, want its node", stream.Msg())
	}
	term := terminate(t, admin, quiet.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	if sig := nextSignal(t, stream); sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != term.TerminationId {
		t.Fatalf("the sibling was told %v, want the drain of %s", sig, term.TerminationId)
	}
	if _, err := quietC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: quiet.Node.NodeId, Reason: "drained"})); err != nil {
		t.Fatalf("the sibling confirms its exit: %v", err)
	}
	quietClose()
	for _, c := range quietFeeds {
		c()
	}
	testserver.WaitFor(t, 10*time.Second, "the sibling's stream to end", func() bool { return srv.OpenStreams("agent:"+quiet.Node.NodeId) == 0 })

	// Another lineage opens its own share as if the rogue held none.
	neighbour := srv.Clients(other.Credential)
	for k := range share {
		closer, err := revocations(neighbour)
		if err != nil {
			t.Fatalf("another lineage's stream %d: %v", k+1, err)
		}
		closers = append(closers, closer)
	}
	if _, closer, err := signals(neighbour); err != nil {
		t.Fatalf("another lineage's signal stream: %v", err)
	} else {
		closers = append(closers, closer)
	}

	// Each rogue node also opens signal streams: its reserve, no more.
	for _, cred := range creds {
		c := srv.Clients(cred)
		for k := range controlplane.SignalStreamReserve + 1 {
			_, closer, err := signals(c)
			if k == controlplane.SignalStreamReserve {
				refusedForTheLineage("a signal stream past the node's reserve", err)
				continue
			}
			if err != nil {
				t.Fatalf("signal stream %d of the node's reserve of %d: %v", k+1, controlplane.SignalStreamReserve, err)
			}
			closers = append(closers, closer)
		}
	}
	if got, want := srv.OpenLineageStreams(root.Node.NodeId), share+rogues*(controlplane.SignalStreamReserve+controlplane.StreamReserve); got != want {
		t.Fatalf("the rogue's lineage holds %d open streams, want its share and its nodes' reserves, %d", got, want)
	}

	// A rogue's stream that ends frees one place of the share, no more
	// (the first node's last feeds were the share's, after its reserve).
	byNode[nodes[0]][len(byNode[nodes[0]])-1]()
	testserver.WaitFor(t, 10*time.Second, "the closed stream to free its place", func() bool {
		return srv.OpenLineageStreams(root.Node.NodeId) == share-1+rogues*(controlplane.SignalStreamReserve+controlplane.StreamReserve)
	})
	last := srv.Clients(creds[len(creds)-1])
	if closer, err := revocations(last); err != nil {
		t.Fatalf("a revocation feed after one of the lineage's ended: %v", err)
	} else {
		closers = append(closers, closer)
	}
	_, err = revocations(last)
	refusedForTheLineage("a second one", err)
}

// TestAnExpiredTokenLosesItsOpenStreams: a tool server's token and a
// viewer's token expire while each holds a stream open — the gate its
// cancel orders, the viewer a termination's progress. Expiry was checked
// only when a call was admitted, so an open stream went on serving the
// expired token for as long as its holder kept the connection up (a
// revoked one already ended at once). Each stream now ends,
// unauthenticated, when its next call would be refused; an agent's
// stream outlives its credential (its heartbeats refresh it) and still
// carries its stop.
func TestAnExpiredTokenLosesItsOpenStreams(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	stopped := register(t, admin, "stopped")
	term := terminate(t, admin, stopped.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	agent := register(t, admin, "agent")

	gate, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "gate-1", Ttl: durationpb.New(20 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	cancels, err := srv.Clients(gate.Msg.Token).Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cancels.Close()
	viewer := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "alice", 10*time.Minute)
	watch, err := srv.Clients(viewer.Token).Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() { // the stream is open and serving
		t.Fatalf("the viewer's watch: %v", watch.Err())
	}
	signals, err := srv.Clients(agent.Credential).Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer signals.Close()
	if !signals.Receive() || signals.Msg().GetOpened() == nil {
		t.Fatalf("the agent's signal stream: %v %v", signals.Msg(), signals.Err())
	}
	testserver.WaitFor(t, 10*time.Second, "the gate's stream to be admitted", func() bool { return srv.OpenStreams("tool:gate-1") == 1 })

	// Past every token's expiry, the agent's credential's included.
	clk.Advance(time.Hour)
	for cancels.Receive() {
	}
	wantLimit(t, "the expired gate's open WatchCancels", cancels.Err(), connect.CodeUnauthenticated, "expired", "the stream is over")
	for watch.Receive() {
	}
	wantLimit(t, "the expired viewer's open WatchTermination", watch.Err(), connect.CodeUnauthenticated, "expired", "the stream is over")
	if _, err := srv.Clients(viewer.Token).Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.TerminationId})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the expired viewer's next call: %v, want unauthenticated as its stream", err)
	}

	stop := terminate(t, admin, agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	for signals.Receive() {
		if sig := signals.Msg().GetSignal(); sig != nil {
			if sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != stop.TerminationId {
				t.Fatalf("the agent was told %v, want the drain of %s", sig, stop.TerminationId)
			}
			return
		}
	}
	t.Fatalf("the agent's signal stream ended with its credential: %v", signals.Err())
}
