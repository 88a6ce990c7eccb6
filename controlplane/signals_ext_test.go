package controlplane_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// http1JSON returns clients that speak what a standard-library client in
// any language can: Connect with JSON bodies over HTTP/1.1 (no HTTP/2, so
// no bidirectional Session).
func http1JSON(srv *testserver.Server, token string) *testserver.Clients {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	return testserver.NewClients(&http.Client{Transport: &http.Transport{Protocols: p}}, srv.URL, token, connect.WithProtoJSON())
}

// nextSignal receives stream messages until a signal arrives.
func nextSignal(t *testing.T, stream *connect.ServerStreamForClient[tetherv1.WatchSignalsResponse]) *tetherv1.SessionSignal {
	t.Helper()
	for stream.Receive() {
		if sig := stream.Msg().GetSignal(); sig != nil {
			return sig
		}
	}
	t.Fatalf("the signal stream ended without a signal: %v", stream.Err())
	return nil
}

// TestWatchSignalsAndHeartbeatOverHTTP1: an agent without HTTP/2 opens
// the signal stream and beats with unary calls. It is told its node at
// once, a drain the moment the termination stores it, the same drain at
// once on a reopened stream (level-triggered), the signal again on its
// next beat, and its credential is refreshed by a beat once a third of it
// is left. Another agent cannot watch its signals or beat for it.
func TestWatchSignalsAndHeartbeatOverHTTP1(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	sibling := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "sibling")
	// A bound so that a missing message fails the test instead of hanging
	// it; nothing waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent := http1JSON(srv, worker.Credential)

	beat, err := agent.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if beat.Msg.Signal != nil || beat.Msg.Credential != nil {
		t.Fatalf("a running agent's first beat: %v", beat.Msg)
	}

	// The rogue sibling asks for the worker's signals and beats for it.
	rogue := http1JSON(srv, sibling.Credential)
	if _, err := firstMessage(rogue.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: worker.Node.NodeId}))); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a sibling watching the worker's signals: %v, want permission_denied", err)
	}
	if _, err := rogue.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: worker.Node.NodeId})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a sibling beating for the worker: %v, want permission_denied", err)
	}
	if _, err := firstMessage(http1JSON(srv, srv.Admin).Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: worker.Node.NodeId}))); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("an operator watching an agent's signals: %v, want permission_denied", err)
	}

	// Credential refresh: 11 of 15 minutes gone, a beat brings a new one.
	clk.Advance(11 * time.Minute)
	beat, err = agent.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	fresh := beat.Msg.GetCredential()
	if fresh == nil || fresh.Credential == "" || !fresh.ExpiresAt.AsTime().After(clk.Now().Add(14*time.Minute)) {
		t.Fatalf("a beat with 4 minutes of credential left: %v, want a fresh credential", beat.Msg)
	}
	agent = http1JSON(srv, fresh.Credential)
	who, err := agent.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil || who.Msg.NodeId != worker.Node.NodeId {
		t.Fatalf("the refreshed credential: %v %v", who, err)
	}

	stream, err := agent.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetOpened().GetNode().GetNodeId() != worker.Node.NodeId {
		t.Fatalf("first message %v (%v), want the worker's node", stream.Msg(), stream.Err())
	}

	term := terminate(t, admin, worker.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	if sig := nextSignal(t, stream); sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != term.TerminationId {
		t.Fatalf("pushed %v, want drain of %s", sig, term.TerminationId)
	}
	again, err := agent.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: worker.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if !again.Receive() || again.Msg().GetOpened() == nil {
		t.Fatalf("a reopened stream's first message: %v (%v)", again.Msg(), again.Err())
	}
	if !again.Receive() || again.Msg().GetSignal().GetKind() != tetherv1.SignalKind_SIGNAL_KIND_DRAIN {
		t.Fatalf("a reopened stream's second message: %v (%v), want the drain at once", again.Msg(), again.Err())
	}
	beat, err = agent.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{}))
	if err != nil || beat.Msg.GetSignal().GetKind() != tetherv1.SignalKind_SIGNAL_KIND_DRAIN {
		t.Fatalf("a draining agent's beat: %v %v, want the drain", beat, err)
	}
}

// TestWatchSignalsEndsWhenTheNodeIsTerminated: an abort is pushed, and
// once the node is terminated the stream ends unauthenticated and the
// agent's beats are refused: nothing more is served on a dead credential.
func TestWatchSignalsEndsWhenTheNodeIsTerminated(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	// A bound so that a missing message fails the test instead of hanging
	// it; nothing waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent := http1JSON(srv, root.Credential)
	stream, err := agent.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetOpened() == nil {
		t.Fatalf("first message %v (%v)", stream.Msg(), stream.Err())
	}

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	if sig := nextSignal(t, stream); sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_ABORT || sig.TerminationId != term.TerminationId {
		t.Fatalf("pushed %v, want abort of %s", sig, term.TerminationId)
	}
	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	// The signals stream is a session the control plane sees open, so the
	// record waits for the confirm deadline, which is set once the grants
	// are revoked: move the clock past it only then.
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the stream of a terminated node ended with %v, want unauthenticated", stream.Err())
	}
	if _, err := agent.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a terminated node's beat: %v, want unauthenticated", err)
	}
}
