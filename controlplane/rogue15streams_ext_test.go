package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
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
// stop and confirms its exit; another lineage is not limited by the
// rogue's streams; and a stream that ends frees a place of the share.
func TestARogueSwarmHoldsOnlyItsLineagesShareOfTheStreams(t *testing.T) {
	const perCaller, share, rogues = 10, 6, 4
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
	// lineage holds its share, the rest are refused.
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
	if admitted != share {
		t.Fatalf("the rogue's %d nodes opened %d revocation feeds, want the lineage's share of %d (each node's cap is %d)", rogues, admitted, share, perCaller)
	}
	// The well-behaved sibling, its lineage's share held by the rogues,
	// still hears its stop and confirms its exit.
	quietC := srv.Clients(quiet.Credential)
	if _, err := revocations(quietC); err == nil {
		t.Fatal("the sibling opened a revocation feed past its lineage's share")
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
	if got, want := srv.OpenLineageStreams(root.Node.NodeId), share+rogues*controlplane.SignalStreamReserve; got != want {
		t.Fatalf("the rogue's lineage holds %d open streams, want its share and its nodes' reserves, %d", got, want)
	}

	// A rogue's stream that ends frees one place of the share, no more.
	byNode[nodes[0]][0]()
	testserver.WaitFor(t, 10*time.Second, "the closed stream to free its place", func() bool {
		return srv.OpenLineageStreams(root.Node.NodeId) == share-1+rogues*controlplane.SignalStreamReserve
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
