package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The rogue agent, second round: what the first round (rogue_ext_test.go)
// did not cover.

// TestARevokedTokenLosesItsOpenStreams: a tool server's token and a
// viewer's token are revoked (tether token revoke) while each holds a
// stream open — the gate its cancel orders, the viewer a termination's
// progress. The revocation was checked only when a call was admitted, so
// an open stream went on serving the revoked token for as long as its
// holder kept the connection up. Each stream now ends, unauthenticated,
// as soon as the revocation reaches the replica.
func TestARevokedTokenLosesItsOpenStreams(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	root := register(t, admin, "root")
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)

	gateToken := srv.ToolServerToken(t, "gate-1")
	cancels, err := srv.Clients(gateToken).Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cancels.Close()
	viewer := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "alice", time.Hour)
	watch, err := srv.Clients(viewer.Token).Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() { // the stream is open and serving
		t.Fatalf("the viewer's watch: %v", watch.Err())
	}

	for _, req := range []*tetherv1.RevokeTokenRequest{{Token: gateToken, Reason: "gate host lost"}, {TokenId: viewer.TokenId, Reason: "laptop stolen"}} {
		if _, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	for cancels.Receive() {
	}
	if connect.CodeOf(cancels.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the revoked gate's open WatchCancels ended with %v, want unauthenticated", cancels.Err())
	}
	for watch.Receive() {
	}
	if connect.CodeOf(watch.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the revoked viewer's open WatchTermination ended with %v, want unauthenticated", watch.Err())
	}
}

// TestAnExitedHolderCannotWorkItsLeaseOverAnOpenChannel: a worker holds a
// lease and a lease Channel open, claims its own exit, and goes on
// renewing, reporting progress and completing the job over the stream it
// opened before. A unary Renew is refused (failed_precondition) and kept
// as a contradiction; the stream's messages were judged without that
// check, so the "exited" worker kept its lease alive and could even
// complete the job. Each is now refused as the unary call would be, kept
// against the worker, and the lease is untouched.
func TestAnExitedHolderCannotWorkItsLeaseOverAnOpenChannel(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	l := w.offer(t, w.job(), w.w1, time.Minute)
	ch := openChannel(t, w.w1C)
	l, _ = ch.send(t, ack(l))
	l, _ = ch.send(t, renew(l, 1))
	if _, err := w.w1C.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.w1, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	before := w.get(t, l.JobId)
	if _, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(renew(l, 2).GetRenew())); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a unary renew after the exit: %v, want failed_precondition", err)
	}
	for _, m := range []*tetherv1.ChannelRequest{renew(l, 3), progress(l, 1, "50%"), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)} {
		if _, d, errText := ch.try(t, m); !strings.HasPrefix(errText, connect.CodeFailedPrecondition.String()) {
			t.Fatalf("%T after the exit over the open channel: decision %v, error %q; want failed_precondition", m.Message, d, errText)
		}
	}
	after := w.get(t, l.JobId)
	if after.State != before.State || after.RenewSequence != before.RenewSequence || after.ProgressSequence != before.ProgressSequence || after.TerminalResult != before.TerminalResult {
		t.Fatalf("the exited worker's stream moved the lease: %v -> %v", before, after)
	}
	if n := len(getNode(t, w.admin, w.w1).Contradictions); n < 4 {
		t.Fatalf("the worker has %d contradictions, want the unary renew and the three stream messages kept", n)
	}
}
