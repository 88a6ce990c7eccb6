package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-second hostile pass over termination: the agent being
// stopped, against the real server, in the moments between an operator's
// stop and its arrival at the agent.

// heldStops holds the termination reconciler from the moment hold is
// called: the next reconcile to begin waits until release, so the
// terminations requested meanwhile stay requested, their marks not begun
// (the window between a stop's request and its mark, which a busy
// reconciler or a restart widens at will).
type heldStops struct {
	mu      sync.Mutex
	holding bool
	release chan struct{}
	once    sync.Once
}

func newHeldStops(t *testing.T) (*heldStops, testserver.Option) {
	h := &heldStops{release: make(chan struct{})}
	return h, func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(string) {
			h.mu.Lock()
			holding := h.holding
			h.mu.Unlock()
			if holding {
				<-h.release
			}
		}
	}
}

// startHeldServer starts a test server whose reconciler a test can hold
// (heldStops), freed before the server stops.
func startHeldServer(t *testing.T) (*heldStops, *testserver.Server) {
	t.Helper()
	held, holdOpt := newHeldStops(t)
	srv := testserver.Start(t, holdOpt)
	t.Cleanup(held.free)
	return held, srv
}

// markHold holds a termination's mark, in chunks of one node, once armed,
// after its nth chunk commits: reached is closed when it holds; free lets
// it go on (safe twice).
type markHold struct {
	mu      sync.Mutex
	armed   bool
	reached chan struct{}
	resume  chan struct{}
	once    sync.Once
}

// startMarkHeld starts a test server (with opts) whose terminations mark
// one node a chunk and, once arm is called, hold after the mark's nth
// chunk; the hold is freed before the server stops.
func startMarkHeld(t *testing.T, nth int, opts ...testserver.Option) (*markHold, *testserver.Server) {
	t.Helper()
	h := &markHold{reached: make(chan struct{}), resume: make(chan struct{})}
	srv := testserver.Start(t, append(opts, func(cfg *controlplane.Config) {
		cfg.TerminationChunk = 1
		cfg.TerminationFault = func(step string, n int) {
			h.mu.Lock()
			stop := h.armed && step == "mark" && n == nth
			if stop {
				h.armed = false
			}
			h.mu.Unlock()
			if stop {
				close(h.reached)
				<-h.resume
			}
		}
	})...)
	t.Cleanup(h.free)
	return h, srv
}

func (h *markHold) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

func (h *markHold) free() { h.once.Do(func() { close(h.resume) }) }

func (h *heldStops) hold() {
	h.mu.Lock()
	h.holding = true
	h.mu.Unlock()
}

// free lets the reconciler go on; safe to call twice (the test's cleanup
// frees it before the server stops).
func (h *heldStops) free() {
	h.once.Do(func() {
		h.mu.Lock()
		h.holding = false
		h.mu.Unlock()
		close(h.release)
	})
}

// TestARogueStartsNoToolCallBetweenItsStopsRequestAndItsMark: an operator
// stops a rogue's subtree (its root R and its child C) while the
// reconciler is busy: the termination is requested, its mark not begun.
// The rogue's gate began its calls all the same (each of R's and C's four
// attempts in flight, the stop's drain then waiting for them), though the
// seed's drain refuses new calls from the request on. Now each is refused
// failed_precondition naming the requested termination, and the record
// lists every refused call as rejected_draining.
func TestARogueStartsNoToolCallBetweenItsStopsRequestAndItsMark(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	tokens := map[string]string{}
	for _, node := range []string{rogue.Node.NodeId, child.Node.NodeId} {
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		tokens[node] = issued.Msg.Token
	}

	held.hold()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	if got := getTermination(t, admin, term.TerminationId).State; got != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED {
		t.Fatalf("the operator's termination is %s while the reconciler is held, want requested", got)
	}
	const attempts = 4
	begun := map[string]int{}
	for node, token := range tokens {
		for range attempts {
			_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "gate-1"}))
			if err == nil {
				begun[node]++
				continue
			}
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), term.TerminationId) {
				t.Fatalf("a call of %s after its stop was requested: %v, want failed_precondition naming termination %s", node, err, term.TerminationId)
			}
		}
	}
	if begun[rogue.Node.NodeId]+begun[child.Node.NodeId] > 0 {
		t.Fatalf("between the operator's stop request and its mark the rogue began %d of %d calls and its child %d of %d; want none", begun[rogue.Node.NodeId], attempts, begun[child.Node.NodeId], attempts)
	}

	held.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	rejected := map[string]int{}
	for _, c := range rec.ToolCalls {
		if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
			t.Fatalf("the record lists call %s of %s as %s; every call was refused", c.CallId, c.NodeId, c.Resolution)
		}
		rejected[c.NodeId]++
	}
	if rejected[rogue.Node.NodeId] != attempts || rejected[child.Node.NodeId] != attempts {
		t.Fatalf("the record lists %v refused calls, want %d of each node", rejected, attempts)
	}
}

// TestAnAgentUnderAnUnmarkedStopStartsNoStopOfItsOwn: an operator stops a
// tree's root G; before the mark reaches G's child P (requested and not
// yet marked, or the roots marked and P not yet), P stops its own child
// C with windows and a record of its own. It was accepted in both cases
// (P, the workload of the operator's stop, acting as an authority over
// part of it). Now it is refused failed_precondition, naming the
// operator's termination that covers P, and writes nothing.
func TestAnAgentUnderAnUnmarkedStopStartsNoStopOfItsOwn(t *testing.T) {
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
			g := register(t, admin, "ops")
			p := spawn(t, srv.Clients(g.Credential), g.Node.NodeId, "p")
			c := spawn(t, srv.Clients(p.Credential), p.Node.NodeId, "c")

			if tc.marked {
				mark.arm()
			} else {
				held.hold()
			}
			op := terminate(t, admin, g.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
			if tc.marked {
				<-mark.reached
				if got := getNode(t, admin, p.Node.NodeId).State; got != tetherv1.NodeState_NODE_STATE_RUNNING {
					t.Fatalf("P is %s after the roots' chunk, want still running (unmarked)", got)
				}
			}
			_, err := srv.Clients(p.Credential).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: c.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "my own window",
				DrainWindow: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
			}))
			if err == nil {
				t.Fatalf("P, covered by the operator's unmarked stop %s, started a termination of its own child", op.TerminationId)
			}
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), op.TerminationId) {
				t.Fatalf("P's own stop under the operator's: %v, want failed_precondition naming termination %s", err, op.TerminationId)
			}
			if got := getNode(t, admin, c.Node.NodeId); got.TerminationId != "" && got.TerminationId != op.TerminationId {
				t.Fatalf("C names termination %s, want none but the operator's", got.TerminationId)
			}
			mark.free()
			held.free()
			waitState(t, srv, op.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		})
	}
}

// TestARoguesWordForTheChildItStoppedIsWeighedAgainInItsOwnStopsRecord: a
// rogue P stops its own child C (its own termination, its own record) and,
// while itself running, vouches for C's exit: its record says C CONFIRMED
// by P. An operator then stops P's subtree. P is that stop's workload now,
// yet its record carried C over from P's as CONFIRMED by agent P: the
// rogue's word, given before its stop, accounted for its child in the
// operator's record. Now the earlier verdict is weighed again against the
// new workload: C is unaccounted (only a claim by P, and the control plane
// never saw C's session end), P's claim shown, and the entry still names
// the record that terminated C.
func TestARoguesWordForTheChildItStoppedIsWeighedAgainInItsOwnStopsRecord(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	p := register(t, admin, "rogue")
	rogue := srv.Clients(p.Credential)
	c := spawn(t, rogue, p.Node.NodeId, "child")

	own := terminate(t, rogue, c.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, time.Hour)
	waitState(t, srv, own.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: c.Node.NodeId, Reason: "I watched it go"})); err != nil {
		t.Fatalf("P vouches for its child: %v", err)
	}
	waitState(t, srv, own.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	first := record(t, admin, own.TerminationId)
	t.Logf("P's own record says C is %s (by %q)", recordNode(t, first, c.Node.NodeId).Outcome, recordNode(t, first, c.Node.NodeId).ConfirmedBy)

	op := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, srv, op.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, op.TerminationId)
	got := recordNode(t, rec, c.Node.NodeId)
	if got.InnerOutcome != tetherv1.InnerOutcome_INNER_OUTCOME_TERMINATED || got.InnerRecordId != first.RecordId || got.InnerTerminationId != own.TerminationId {
		t.Fatalf("C's entry in the operator's record: inner %s, record %q, termination %q; want terminated by %s (record %s)", got.InnerOutcome, got.InnerRecordId, got.InnerTerminationId, own.TerminationId, first.RecordId)
	}
	if got.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("the operator's record of P's subtree says C is %s (confirmed by %q): the word of P, the stop's own workload, accounted for its child", got.Outcome, got.ConfirmedBy)
	}
	if got.ClaimedBy != "agent:"+p.Node.NodeId+" (ancestor)" || !strings.Contains(got.UnaccountedReason, "claim") {
		t.Fatalf("C's entry: claimed by %q, reason %q; want P's claim shown and the reason naming it", got.ClaimedBy, got.UnaccountedReason)
	}
}

// TestAStopOfAnExitedDecoyCoversItsSubtreeFromItsFirstChunk: a rogue X
// confirms its own exit (its word alone: a claim) while its child Y works
// on. An operator stops X's subtree; the mark's first chunk (the roots)
// commits, and X, exited, keeps its state under the termination, as an
// exited node does. An exited ancestor stopped nothing below it, so until
// the mark reached Y, chunks later, Y began tool calls and spawned
// children (each spawn more for the mark to walk: a subtree that spawns
// faster than the mark walks it holds its stop off) as if no stop
// covered it. Now an exited node a termination has marked covers its
// subtree as a stopping one does: Y's calls and spawns are refused
// failed_precondition, naming the termination.
func TestAStopOfAnExitedDecoyCoversItsSubtreeFromItsFirstChunk(t *testing.T) {
	mark, srv := startMarkHeld(t, 1)
	admin := srv.AdminClients()
	ctx := context.Background()
	x := register(t, admin, "decoy")
	y := spawn(t, srv.Clients(x.Credential), x.Node.NodeId, "worker")
	yClients := srv.Clients(y.Credential)
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: y.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	if _, err := srv.Clients(x.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: x.Node.NodeId, Reason: "done, honestly"})); err != nil {
		t.Fatal(err)
	}

	mark.arm()
	op := terminate(t, admin, x.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	<-mark.reached
	if got := getNode(t, admin, x.Node.NodeId); got.State != tetherv1.NodeState_NODE_STATE_EXITED || got.TerminationId != op.TerminationId {
		t.Fatalf("after the roots' chunk X is %s under %q, want exited under %s", got.State, got.TerminationId, op.TerminationId)
	}
	const attempts = 4
	calls, spawns := 0, 0
	for i := range attempts {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if err == nil {
			calls++
		} else if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), op.TerminationId) {
			t.Fatalf("Y's call under the marked decoy: %v, want failed_precondition naming %s", err, op.TerminationId)
		}
		_, err = yClients.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: y.Node.NodeId, Name: "more-" + string(rune('a'+i))}))
		if err == nil {
			spawns++
		} else if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), op.TerminationId) {
			t.Fatalf("Y's spawn under the marked decoy: %v, want failed_precondition naming %s", err, op.TerminationId)
		}
	}
	if calls+spawns > 0 {
		t.Fatalf("between the stop's first chunk and its arrival at Y, Y began %d of %d calls and spawned %d of %d children below the exited decoy; want none", calls, attempts, spawns, attempts)
	}
	mark.free()
	waitState(t, srv, op.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
}
