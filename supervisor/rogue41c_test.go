package supervisor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue41CAnOperatorsDecidedStopDoesNotWaitBehindTheRoguesTerminations:
// in each tree an operator's stops take a turn of their own in the
// terminations' loop, beside the tree's agents' (rogue17kick), so that a
// rogue's terminations that move at once do not make an operator's stop of
// it wait for each of them. But a stop an operator decided on a stop
// proposal (its approval of a stop rule's proposal, or its own stop rule's
// policy action) was written without its tree: its first pass had the
// unplaced terminations' turn, and the loop then placed it by its root's
// ancestors — in the tree's agents' turn, behind the rogue's. The rogue
// stops its 50 children with a confirm deadline just before the operator's
// stop of its other child waits to; once those deadlines pass, the
// operator's stop waits for the rogue's terminations' records one by one.
// Counted, not timed: the loop is held in the first of the rogue's passes
// while the operator's deadline passes, then the passes are counted until
// the operator's termination has its next (one of the rogue's, and one of
// a termination no longer placed, may come first).
//
// The stops an operator's policy approved (its rules' actions) take a turn
// of their own, apart from the operator's own: a rogue that makes the
// operator's rule true on each of its 50 children has as many of them
// queued, and an operator's own stop of its other child does not wait for
// each of them either.
func TestRogue41CAnOperatorsDecidedStopDoesNotWaitBehindTheRoguesTerminations(t *testing.T) {
	t.Run("an operator's approval", func(t *testing.T) { rogue41cDecidedStop(t, "approval", false) })
	t.Run("an operator's rule's policy", func(t *testing.T) { rogue41cDecidedStop(t, "policy", false) })
	t.Run("an operator's own stop behind its rule's", func(t *testing.T) { rogue41cDecidedStop(t, "operator", true) })
}

// rogue41cDecidedStop: how is the operator's stop of the worker
// ("approval", "policy" or "operator"); byRule: the rogue's children are
// stopped by the operator's rule's policy, which the rogue made true, not
// by the rogue.
func rogue41cDecidedStop(t *testing.T, how string, byRule bool) {
	const k = 50
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	loop, ctx := runHeldLoop(t, s)

	r, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	rogue := "agent:" + r.NodeID
	ids := loop.stopRogueChildren(t, ctx, s, r.NodeID, k, "rogue41c", byRule)

	// The operator's stop of the rogue's other child: a stop rule's
	// proposal, approved by the operator or by the operator's policy.
	w, err := s.Tree.Spawn(ctx, r.NodeID, "worker", nil, rogue, nil)
	if err != nil {
		t.Fatal(err)
	}
	firing := &StopRuleFiring{RuleID: "rule-w", Name: "too-many-calls", SetBy: "operator:admin", Severity: "critical", NodeID: w.NodeID}
	var policy ProposalPolicy
	if how == "policy" {
		policy.RuleActions = []RuleAction{{Severity: "critical", Mode: ModeAbort}}
	}
	var stopID string
	switch how {
	case "operator":
		// Its confirm deadline passes after the rule's stops'.
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: w.NodeID, Mode: ModeAbort, ConfirmTimeout: DefaultConfirmTimeout * 4 / 3,
			Reason: "stop it", RequestedBy: "operator:admin"})
		if err != nil {
			t.Fatal(err)
		}
		stopID = term.ID
	default:
		var p *StopProposal
		var filed Termination
		if err := s.Store.Update(ctx, func(tx store.Txn) error {
			var err error
			p, filed, err = s.FileRuleProposal(tx, w.NodeID, firing, ModeAbort, policy)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		stopID = filed.ID
		if how == "policy" {
			s.KickRequested(filed) // as the stop rules' evaluator does
		} else {
			_, term, err := s.Decide(ctx, p.ProposalID, true, "stop it", "operator:admin")
			if err != nil {
				t.Fatal(err)
			}
			stopID = term.ID
		}
	}
	if stopID == "" {
		t.Fatal("the operator's stop was not started")
	}
	for _, id := range append([]string{stopID}, ids...) {
		rogue41cWaitPhase(t, s, id, PhaseReconciling)
	}

	// The rogue's 50 deadlines pass at once; the loop is held in the first
	// of their passes while the operator's passes too.
	first := DefaultConfirmTimeout / 3
	if byRule {
		first = DefaultConfirmTimeout
	}
	before := loop.passesBefore(t, s, first, stopID)
	if before < 0 {
		t.Fatal("the operator's termination was not reconciled after its deadline")
	}
	t.Logf("%d passes ran before the operator's termination's, after its deadline", before)
	if before > 2 {
		t.Fatalf("%d passes of the 50 stops of the rogue's children ran before the operator's stop's, its deadline passed; want at most 2 (an operator's stops take a turn of their own in its tree)", before)
	}
	for _, id := range ids {
		rogue41cWaitPhase(t, s, id, PhaseTerminated)
	}
	n, err := s.Tree.Get(ctx, w.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if n.State != tree.NodeStateTerminated || n.TerminationID != stopID {
		t.Fatalf("the worker is %s under %s, want terminated under the operator's stop %s", tree.StateName(n.State), n.TerminationID, stopID)
	}
}

// heldLoop runs a supervisor's terminations' loop (runHeldLoop), records
// the order of its passes, and can hold it in the first pass of one of the
// rogue's terminations (markRogues) while the clock moves on.
type heldLoop struct {
	mu      sync.Mutex
	order   []string
	rogues  map[string]bool
	holding bool
	held    chan struct{}
	release chan struct{}
}

// runHeldLoop hooks s's passes (s.Reconciled) and runs its loop until the
// test ends, on the context it returns.
func runHeldLoop(t *testing.T, s *Supervisor) (*heldLoop, context.Context) {
	t.Helper()
	l := &heldLoop{rogues: map[string]bool{}, held: make(chan struct{}), release: make(chan struct{})}
	s.Reconciled = func(id string) {
		l.mu.Lock()
		l.order = append(l.order, id)
		hold := l.holding && l.rogues[id]
		if hold {
			l.holding = false
		}
		l.mu.Unlock()
		if hold {
			close(l.held)
			<-l.release
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	return l, ctx
}

// markRogues marks the rogue's terminations, ids: the loop is held in the
// first pass of one of them.
func (l *heldLoop) markRogues(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.rogues[id] = true
	}
}

// stopRogueChildren has the rogue (node) spawn k children, silent-00 on,
// and stop each (an abort whose confirm deadline, DefaultConfirmTimeout/3,
// is set to pass before the honest stop's) with reason, or, byRule, has
// the operator's rule's policy stop each (rogue41cRuleStop); it marks
// those terminations the rogue's (markRogues) and returns them.
func (l *heldLoop) stopRogueChildren(t *testing.T, ctx context.Context, s *Supervisor, node string, k int, reason string, byRule bool) []string {
	t.Helper()
	rogue := "agent:" + node
	var ids []string
	for i := range k {
		c, err := s.Tree.Spawn(ctx, node, fmt.Sprintf("silent-%02d", i), nil, rogue, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Its confirm deadline is set to pass before the operator's.
		if byRule {
			ids = append(ids, rogue41cRuleStop(t, s, c.NodeID, fmt.Sprintf("rule-%02d", i)))
			continue
		}
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: c.NodeID, Mode: ModeAbort, ConfirmTimeout: DefaultConfirmTimeout / 3,
			Reason: reason, RequestedBy: rogue, RequesterNodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, term.ID)
	}
	l.markRogues(ids)
	return ids
}

// passesBefore advances s's manual clock by first (the rogue's deadlines
// pass), holds the loop in the first of the rogue's passes while the clock
// advances DefaultConfirmTimeout*4/3 more (stopID's deadline passes),
// releases it, waits until stopID is terminated and returns how many
// passes ran, from the release, before stopID's: -1 if none of stopID's
// did.
func (l *heldLoop) passesBefore(t *testing.T, s *Supervisor, first time.Duration, stopID string) int {
	t.Helper()
	clk := s.Clock.(*clock.Manual)
	l.mu.Lock()
	l.holding = true
	l.mu.Unlock()
	clk.Advance(first)
	<-l.held
	clk.Advance(DefaultConfirmTimeout * 4 / 3)
	l.mu.Lock()
	from := len(l.order)
	l.mu.Unlock()
	close(l.release)
	rogue41cWaitPhase(t, s, stopID, PhaseTerminated)

	l.mu.Lock()
	defer l.mu.Unlock()
	for i, id := range l.order[from:] {
		if id == stopID {
			return i
		}
	}
	return -1
}

// rogue41cRuleStop is the stop the operator's rule's policy action starts
// on node, as the stop rules' evaluator files it (the rogue made the rule
// true there).
func rogue41cRuleStop(t *testing.T, s *Supervisor, node, rule string) string {
	t.Helper()
	firing := &StopRuleFiring{RuleID: rule, Name: "cost", SetBy: "operator:admin", Severity: "critical", NodeID: node}
	policy := ProposalPolicy{RuleActions: []RuleAction{{Severity: "critical", Mode: ModeAbort}}}
	var term Termination
	if err := s.Store.Update(context.Background(), func(tx store.Txn) error {
		var err error
		_, term, err = s.FileRuleProposal(tx, node, firing, ModeAbort, policy)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if term.ID == "" {
		t.Fatal("the rule's policy started no stop")
	}
	s.KickRequested(term)
	return term.ID
}

// rogue41cWaitPhase waits for the loop to move a termination to phase (or
// past it).
func rogue41cWaitPhase(t *testing.T, s *Supervisor, id string, phase Phase) {
	t.Helper()
	for range 6000 {
		term, err := s.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if term.Phase >= phase {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("termination %s did not reach %s", id, phase)
}
