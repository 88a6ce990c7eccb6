package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The twenty-eighth hostile pass, reviewing what the twenty-seventh changed
// in termination and the record: the agent being stopped takes the routes
// beside each fix. Each test plays one rogue through the real server
// (Badger on disk, or etcd with TETHER_TEST_STORE=etcd; real HTTP/2, real
// JWTs, the manual clock).

// TestRogue28AStreamHeldPastTheSessionsEndIsLifeAfterIt: since the
// twenty-seventh pass any request of a node's own credential after its
// session's end is the control plane seeing it alive after that end
// (tree.Act, on each request's arrival). A stream opened before the end
// arrives before it: a rogue child opens its revocation feed (a stream
// of its credential that is not a session in the exit evidence's sense)
// with its session, ends the session, keeps reading the feed — its
// process alive and connected, told of each revocation in its tree — and
// claims its exit under its parent's stop; the control plane ends the
// feed itself on the claim (so too a watch of a termination it requested). The record read CONFIRMED by control-plane
// on the strength of the session's end it had outlived. A stream of the
// node's credential that ends after its session's end (closed by the
// agent, or by the control plane at the claim) is now the control plane
// seeing the node alive until then: the claim reads unaccounted. Guard:
// the feed closed before the session's end, then the claim, is confirmed
// as before.
func TestRogue28AStreamHeldPastTheSessionsEndIsLifeAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stream    string // "feed": its revocation feed; "watch": a watch of a termination it requested
		feedEnds  string // "before-end": the agent closes it before its session's end; "at-claim": held until the claim ends it
		confirmed bool
	}{
		{"a feed closed before the end (guard)", "feed", "before-end", true},
		{"a feed held past the end until the claim", "feed", "at-claim", false},
		{"a termination watch held past the end until the claim", "watch", "at-claim", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSeedWorld(t)
			ctx := context.Background()
			self := w.c.Node.NodeId
			sess, err := openSession(t, w.cAgent, self)
			if err != nil {
				t.Fatal(err)
			}
			fctx, fcancel := context.WithCancel(ctx)
			defer fcancel()
			// feed is the rogue's stream: its next message, and its end.
			var feed interface {
				Receive() bool
				Err() error
				Close() error
			}
			switch tc.stream {
			case "feed":
				feed, err = w.cAgent.Capability.WatchRevocations(fctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
			case "watch":
				// The rogue stops a child of its own, which never exits,
				// and watches that termination.
				d := spawn(t, w.cAgent, self, "grandchild")
				mine := terminate(t, w.cAgent, d.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, time.Hour)
				feed, err = w.cAgent.Supervisor.WatchTermination(fctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: mine.TerminationId}))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer feed.Close()
			if !feed.Receive() {
				t.Fatalf("the rogue's %s: %v", tc.stream, feed.Err())
			}
			w.clk.Advance(time.Minute)
			if tc.feedEnds == "before-end" {
				fcancel()
				_ = feed.Close()
				// The feed ends before the session only once the server's
				// handler has returned (it notes the node seen on its way
				// out): the agent's cancel reaches the handler
				// asynchronously, and a loaded machine could run it after
				// the session's end was stored, the guard then failing on
				// a feed that did outlive the end at the server.
				procedure := tetherv1connect.CapabilityServiceWatchRevocationsProcedure
				testserver.WaitFor(t, 20*time.Second, "the server to end the rogue's feed", func() bool {
					v, _ := scrapeMetrics(t, w.srv.HTTP, w.srv.URL).value("tether_server_open_streams", map[string]string{"procedure": procedure})
					return v == 0
				})
				w.clk.Advance(time.Minute)
			}
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "the control plane to see the session end", func() bool {
				return getNode(t, w.admin, self).SessionClosedAt != nil
			})
			w.clk.Advance(time.Minute)
			term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			if _, err := w.cAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			if tc.feedEnds == "at-claim" {
				// The control plane ends the stream of a node whose exit
				// was confirmed; the rogue reads on until it does. (The
				// watch may end first, its termination ended by its
				// parent's stop taking the grandchild over: after the
				// session's end all the same.)
				for feed.Receive() {
				}
				if code := connect.CodeOf(feed.Err()); code != connect.CodeFailedPrecondition && (tc.stream == "feed" || feed.Err() != nil) {
					t.Fatalf("the rogue's %s after its claim ended with %v, want failed_precondition", tc.stream, feed.Err())
				}
			}
			waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			w.clk.Advance(2 * time.Minute)
			waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, w.admin, term.TerminationId), self)
			if tc.confirmed {
				if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "control-plane" {
					t.Fatalf("record: %s confirmed by %q (reason %q), want confirmed by the control plane", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
				}
				return
			}
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, "after its session ended") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted: the rogue's %s was open after its session ended",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.stream)
			}
		})
	}
}
