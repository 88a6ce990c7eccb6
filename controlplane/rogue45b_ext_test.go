package controlplane_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue45BAnAgentCredentialRevokedByValueEndsItsStreamsAndIsNotRefreshed:
// a rogue holds a worker's credential (leaked in a log) and opened the
// worker's session with it. The security team revokes the credential by
// value (tether token revoke --token-value-file). A new call with it is
// refused, but the session it opened went on: each heartbeat acknowledged
// (the node kept alive on the rogue's word), and once a third of the
// credential's life was left the session handed the rogue a fresh
// credential, of another id, that every call took: the revocation was
// undone by the control plane itself. An agent's stream outlives its
// credential's expiry (its heartbeats refresh it), not its revocation:
// each message on it is checked as a call is, and a stream ends
// unauthenticated as the revocation is published, the session with no
// fresh credential. A signals stream the rogue had opened with the
// credential, which sends nothing after its request (the node's session
// in its exit evidence), stayed open for as long as the node ran.
func TestRogue45BAnAgentCredentialRevokedByValueEndsItsStreamsAndIsNotRefreshed(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "worker")
	node := worker.Node.NodeId
	rogue := srv.Clients(worker.Credential)

	// A bound so that a missing message fails the test instead of hanging
	// it; nothing waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opened, err := openSessionIn(t, ctx, rogue, node)
	if err != nil {
		t.Fatalf("the session's first message: %v; want opened", err)
	}
	stream := opened.stream
	// beat sends one heartbeat and returns the credential the session
	// handed out with its acknowledgement (when one is due), or the error
	// the session ended with.
	beat := func(refreshDue bool) (string, error) {
		if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		acked := false
		for {
			resp, err := stream.Receive()
			if err != nil {
				return "", err
			}
			if c := resp.GetCredential().GetCredential(); c != "" {
				return c, nil
			}
			if resp.GetHeartbeatAck() != nil {
				acked = true
			}
			if acked && !refreshDue {
				return "", nil
			}
		}
	}
	if _, err := beat(false); err != nil {
		t.Fatalf("a heartbeat before the revocation: %v", err)
	}
	// And a signals stream, which sends nothing after its request: the
	// node's session in its exit evidence as long as it is open.
	watchCtx, stopWatch := context.WithTimeout(ctx, 20*time.Second)
	defer stopWatch()
	signals, err := rogue.Agent.WatchSignals(watchCtx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	defer signals.Close()
	if !signals.Receive() || signals.Msg().GetOpened() == nil {
		t.Fatalf("the signals stream's first message: %v, %v; want opened", signals.Msg(), signals.Err())
	}

	sec := admin // an admin holds the security role's authority
	if _, err := sec.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: worker.Credential, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the worker's credential by value: %v", err)
	}
	if _, err := rogue.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a call with the revoked credential: %v, want unauthenticated", err)
	}

	// The signals stream ends as the revocation is published, though it
	// sends nothing (the bound above only keeps a stream that stays open
	// from hanging the test).
	for signals.Receive() {
	}
	if connect.CodeOf(signals.Err()) != connect.CodeUnauthenticated || watchCtx.Err() != nil {
		t.Fatalf("the signals stream the revoked credential opened, after the revocation: %v (its bound: %v), want ended unauthenticated", signals.Err(), watchCtx.Err())
	}

	// On the session it opened before: three heartbeats, then one with a
	// third of the credential's life left.
	acked := 0
	var ended error
	for range 3 {
		if _, err := beat(false); err != nil {
			ended = err
			break
		}
		acked++
	}
	fresh := ""
	if ended == nil {
		clk.Advance(11 * time.Minute) // of 15: 4 minutes left
		fresh, ended = beat(true)
		if ended == nil {
			acked++
		}
	}
	freshWorks := false
	if fresh != "" {
		who, err := srv.Clients(fresh).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		freshWorks = err == nil && who.Msg.NodeId == node
	}
	t.Logf("after the revocation: %d heartbeats acknowledged on the session the revoked credential opened; fresh credential handed out: %v, and every call takes it: %v; the session ended with: %v",
		acked, fresh != "", freshWorks, ended)
	if acked != 0 || fresh != "" {
		t.Fatalf("the session a revoked credential opened acknowledged %d heartbeats and handed out a fresh credential: %v (taken: %v); want none, the session ended", acked, fresh != "", freshWorks)
	}
	if connect.CodeOf(ended) != connect.CodeUnauthenticated {
		t.Fatalf("the session ended with %v, want unauthenticated", ended)
	}

	// The revocation stopped a credential, not the node: the worker is
	// still running, and its parent still spawns beside it.
	if n := getNode(t, admin, node); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the worker after its credential's revocation: %v, want running", n.State)
	}
	spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "sibling")
}
