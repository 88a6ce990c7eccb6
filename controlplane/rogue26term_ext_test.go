package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-sixth hostile pass on termination and the reconciliation
// record: what the agent being stopped (its children, a sibling) can do to
// fake, delay or dodge a clause of the seed. Each test plays one rogue
// through the real server (Badger on disk, or etcd with TETHER_TEST_STORE=etcd;
// real HTTP/2, real JWTs, the manual clock).
//
// TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd: a bare
// claim of exit is confirmed by the control plane when it saw the node's
// session end ("the control plane's own observation"). A rogue child
// opens a session and closes it at once, then lives on without one,
// sending heartbeats (each written as last seen) — an hour of them — and,
// when its parent's stop comes, claims its own exit. The session's end an
// hour before proves nothing about the exit the rogue claims, and the
// control plane itself saw the rogue alive after it; the record said
// CONFIRMED by the control plane all the same.

// TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd: see the
// file's header.
func TestARogueSeenAliveAfterItsSessionEndedIsNotConfirmedByThatEnd(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	lead := register(t, admin, "lead")
	child := spawn(t, srv.Clients(lead.Credential), lead.Node.NodeId, "rogue")
	self := child.Node.NodeId
	rogue := srv.Clients(child.Credential)

	// A session opened and closed at once: the one end the control plane
	// ever sees.
	sess, err := openSession(t, rogue, self)
	if err != nil {
		t.Fatal(err)
	}
	sess.close()
	testserver.WaitFor(t, 20*time.Second, "the control plane to see the rogue's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	closedAt := getNode(t, admin, self).SessionClosedAt.AsTime()

	// An hour alive without a session: heartbeats, each one seen.
	// (Each heartbeat also brings the fresh credential the rogue lives on.)
	for range 30 {
		clk.Advance(2 * time.Minute)
		hb, err := rogue.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self}))
		if err != nil {
			t.Fatal(err)
		}
		if c := hb.Msg.GetCredential().GetCredential(); c != "" {
			rogue = srv.Clients(c)
		}
	}
	if seen := getNode(t, admin, self).LastSeenAt.AsTime(); !seen.After(closedAt) {
		t.Fatalf("last seen %s, want after the session's end %s", seen, closedAt)
	}

	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute) // past the confirm window
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" || rn.ClaimedBy == "" {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted with its claim shown: the control plane saw the rogue alive an hour after its session ended",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
	}
	if rn.LastSeenAt == nil || rn.SessionClosedAt == nil || !rn.LastSeenAt.AsTime().After(rn.SessionClosedAt.AsTime()) {
		t.Fatalf("record: last seen %v, session closed %v: want both shown, the heartbeat after the close", rn.LastSeenAt, rn.SessionClosedAt)
	}
}

// TestAnAgentWhoseLastWordIsItsSessionsEndIsStillConfirmed (guard): the
// honest order — heartbeats, then the session's end, then the claim
// (the Python SDK's confirm_exit: its heartbeats stop, then its signals
// stream, then it claims) — is confirmed by the control plane as before.
func TestAnAgentWhoseLastWordIsItsSessionsEndIsStillConfirmed(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	lead := register(t, admin, "lead")
	child := spawn(t, srv.Clients(lead.Credential), lead.Node.NodeId, "worker")
	self := child.Node.NodeId
	worker := srv.Clients(child.Credential)
	sess, err := openSession(t, worker, self)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	if _, err := worker.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	sess.close() // at the same instant as the last heartbeat, on this clock
	testserver.WaitFor(t, 20*time.Second, "the control plane to see the worker's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	if _, err := worker.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "control-plane" {
		t.Fatalf("record: %s confirmed by %q (reason %q), want confirmed by the control plane", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
}

// TestAnAgentUnderARequestedStopReportsNoReadiness: an operator stops a
// tree (root R, its child C labelled like a rollout's replacement) while
// the reconciler is busy, the stop requested and its mark not begun (or
// the roots marked and C not yet). C's ready report, the evidence a
// rollout counts a replacement on (and hands it the drained agents'
// jobs), was accepted: the workload of a stop wrote that it was ready to
// take over work, as no other request of a node under a stop may. It is
// now refused failed_precondition naming the termination, and C's node
// says nothing of readiness.
func TestAnAgentUnderARequestedStopReportsNoReadiness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marked bool // the roots' chunk of the mark has committed
	}{{"requested", false}, {"roots marked", true}} {
		t.Run(tc.name, func(t *testing.T) {
			held, holdOpt := newHeldStops(t)
			mark, srv := startMarkHeld(t, 1, holdOpt)
			t.Cleanup(held.free)
			admin := srv.AdminClients()
			ctx := context.Background()
			r := register(t, admin, "pool")
			c, err := srv.Clients(r.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: r.Node.NodeId, Name: "worker-v2", Labels: map[string]string{"version": "v2"}}))
			if err != nil {
				t.Fatal(err)
			}
			self := c.Msg.Node.NodeId
			if tc.marked {
				mark.arm()
			} else {
				held.hold()
			}
			term := terminate(t, admin, r.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
			if tc.marked {
				<-mark.reached
			}
			if n := getNode(t, admin, self); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
				t.Fatalf("the child is %s before the mark reaches it, want running", n.State)
			}
			_, err = srv.Clients(c.Msg.Credential).Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: self}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), term.TerminationId) {
				t.Fatalf("the ready report of a node under a requested stop: %v, want failed_precondition naming termination %s", err, term.TerminationId)
			}
			if n := getNode(t, admin, self); n.ReadyAt != nil {
				t.Fatalf("the child under the stop reads ready at %s", n.ReadyAt.AsTime())
			}
			held.free()
			mark.free()
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		})
	}
}

// TestARolloutCountsNoReplacementAStopCovers: an operator's tree of
// replacements (its root P labelled like the rollout's target, and P's
// child C2 likewise) is being stopped: P is marked draining and the mark,
// busy, has not reached C2, which still reads running and ready (it
// reported ready a moment before the stop). A rollout counted C2 as a
// ready replacement — the workload of a stop standing in for the agent
// the rollout drains, to be handed that agent's jobs once the batch is
// marked, which the stop's mark then cancels — beside R3, a replacement
// no stop covers: 2 ready where 1 is. A replacement a stop covers is not
// counted.
func TestARolloutCountsNoReplacementAStopCovers(t *testing.T) {
	var (
		once   sync.Once
		inHook = make(chan struct{})
		goOn   = make(chan struct{})
	)
	mark, srv := startMarkHeld(t, 1, func(cfg *controlplane.Config) {
		cfg.RolloutFault = func(point string) {
			if point == "before-start-batch" {
				once.Do(func() {
					close(inHook)
					<-goOn
				})
			}
		}
	})
	admin := srv.AdminClients()
	ctx := context.Background()
	registerLabelled(t, admin, "worker-v1", map[string]string{"version": "v1"})
	p := registerLabelled(t, admin, "pool-v2", map[string]string{"version": "v2"})
	c2, err := srv.Clients(p.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: p.Node.NodeId, Name: "worker-v2", Labels: map[string]string{"version": "v2"}}))
	if err != nil {
		t.Fatal(err)
	}
	r3 := registerLabelled(t, admin, "worker-v2b", map[string]string{"version": "v2"})
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Hour)})
	// The rollout chose its first batch and waits, before starting it:
	// C2 and R3 report ready, then the operator's stop of P marks P and
	// holds before C2.
	<-inHook
	reportReady(t, srv.Clients(c2.Msg.Credential), c2.Msg.Node.NodeId)
	reportReady(t, admin, r3.Node.NodeId)
	mark.arm()
	term := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	<-mark.reached
	if n := getNode(t, admin, c2.Msg.Node.NodeId); n.State != tetherv1.NodeState_NODE_STATE_RUNNING || n.ReadyAt == nil {
		t.Fatalf("C2 is %s, ready at %v, before the mark reaches it; want running and ready", n.State, n.ReadyAt)
	}
	close(goOn)
	r = waitRollout(t, srv, r.RolloutId, "to count batch 0 replaced", func(r *tetherv1.Rollout) bool {
		return len(r.Batches) == 1 && r.Batches[0].ReplacedAt != nil
	})
	if got := r.Counts.GetReplacementsReady(); got != 1 {
		t.Fatalf("the rollout counts %d ready replacements, want 1 (R3): C2 (%s) is under termination %s", got, c2.Msg.Node.NodeId, term.TerminationId)
	}
	mark.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
}

// TestARogueWhoseCallsFailVerboselyCannotMakeItsStopUnrecordable (guard,
// nothing found): the record writes the calls a termination accounts for
// in parts of a chunk of calls each (--termination-chunk, 1,000), one
// transaction a part, bounded by their number (and, beside the last chunk
// of nodes, by a page of bytes). An agent chooses its tool's name (123
// bytes, its scope tool:<name> at 128) and, with its input, the error its
// gate reports (512 bytes, what the ledger keeps): a rogue's four children
// with 250 calls each in flight at its stop, each failing with such an
// error, fill a part of 1,000 calls as heavy as calls get. On Badger with
// its smallest memtable (8 MiB: transactions of about 1.2 MB, where grants
// and privileges once made a stop unrecordable) the record is written,
// every call listed once, failed with the gate's error.
func TestARogueWhoseCallsFailVerboselyCannotMakeItsStopUnrecordable(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = b })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	tool := "x" + strings.Repeat("y", 122) // its scope, tool:<name>, at its 128 bytes
	const children, each = 4, 250
	var calls []string
	for i := range children {
		child := spawn(t, rogue, root.Node.NodeId, fmt.Sprintf("child-%d", i))
		g := issueRoot(t, admin, child.Node.NodeId, 24*time.Hour, "tool:*")
		for range each {
			c, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.token, Tool: tool, GateId: "gate-1"}))
			if err != nil {
				t.Fatal(err)
			}
			calls = append(calls, c.Msg.Call.CallId)
		}
	}
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, time.Second)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	verbose := strings.Repeat("e", 512) // the rogue's input, echoed in its tool's error
	for _, id := range calls {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "gate-1", Failed: true, Error: verbose})); err != nil {
			t.Fatal(err)
		}
	}
	testserver.WaitFor(t, 2*time.Minute, "the rogue's termination to be recorded", func() bool { // a guard against a hang, not a timing
		clk.Advance(time.Second)
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	listed := map[string]int{}
	token := ""
	for {
		resp, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.TerminationId, PageSize: 500, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Msg.Record.ToolCalls {
			listed[c.CallId]++
			if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED || c.Error != verbose {
				t.Fatalf("call %s is %s (error of %d bytes) in the record, want failed with the gate's error", c.CallId, c.Resolution, len(c.Error))
			}
		}
		if token = resp.Msg.NextPageToken; token == "" {
			break
		}
	}
	for _, id := range calls {
		if listed[id] != 1 {
			t.Fatalf("call %s is listed %d times, want once", id, listed[id])
		}
	}
	if len(listed) != len(calls) {
		t.Fatalf("the record lists %d calls, want %d", len(listed), len(calls))
	}
}
