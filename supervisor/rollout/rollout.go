package rollout

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/enumname"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/sortedmap"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Rollout errors.
var (
	ErrRolloutNotFound = fault.New(fault.NotFound, "supervisor: rollout not found")
	// ErrRolloutFinished: the rollout completed or was aborted; it cannot
	// be paused, resumed or aborted any more.
	ErrRolloutFinished = fault.New(fault.Precondition, "supervisor: rollout is finished")
)

// RolloutState is a rollout's state: running ⇄ paused → completed | aborted.
type RolloutState int

const (
	RolloutRunning RolloutState = iota + 1
	// RolloutPaused: no new batch starts; started batches still finish.
	RolloutPaused
	RolloutCompleted
	RolloutAborted
)

var rolloutStateNames = [...]string{
	RolloutRunning:   "running",
	RolloutPaused:    "paused",
	RolloutCompleted: "completed",
	RolloutAborted:   "aborted",
}

func (s RolloutState) String() string { return enumname.Of(rolloutStateNames[:], s, "rollout_state") }

// Finished reports whether the state is terminal.
func (s RolloutState) Finished() bool { return s == RolloutCompleted || s == RolloutAborted }

// BatchState is where one batch is: draining (its termination runs) →
// replacing (terminated, replacements not all ready or leases not handed
// over) → done; or released when the rollout was aborted first.
type BatchState int

const (
	BatchDraining BatchState = iota + 1
	BatchReplacing
	BatchDone
	BatchReleased
)

var batchStateNames = [...]string{
	BatchDraining:  "draining",
	BatchReplacing: "replacing",
	BatchDone:      "done",
	BatchReleased:  "released",
}

func (s BatchState) String() string { return enumname.Of(batchStateNames[:], s, "batch_state") }

// RolloutBatch is one batch: the agents it drains through one termination
// (one record), and how far it got.
type RolloutBatch struct {
	Index int `json:"index"`
	// NodeIDs are the agents the batch drains (its termination's roots).
	NodeIDs       []string  `json:"node_ids"`
	TerminationID string    `json:"termination_id"`
	RecordID      string    `json:"record_id,omitempty"`
	StartedAt     time.Time `json:"started_at"`
	Deadline      time.Time `json:"deadline"`
	TerminatedAt  time.Time `json:"terminated_at,omitzero"`
	// ReplacedAt: enough replacements were ready to cover this batch and
	// every earlier one.
	ReplacedAt time.Time `json:"replaced_at,omitzero"`
	// HandedOver: a handover pass ran after the batch was replaced (or
	// part of one, which reassigned LeasesHandedOver's share before it
	// failed: the batch is done only once no open lease is left).
	HandedOver          bool      `json:"handed_over,omitempty"`
	LeasesHandedOver    int       `json:"leases_handed_over,omitempty"`
	LeasesNotHandedOver []string  `json:"leases_not_handed_over,omitempty"`
	CompletedAt         time.Time `json:"completed_at,omitzero"`
	Released            bool      `json:"released,omitempty"`
	// Exited are those of NodeIDs whose exit was claimed (or confirmed)
	// when the batch started: the batch drains them like the others (its
	// termination revokes and cancels what they hold, its record weighs
	// the claim), but they were not available before it, so no replacement
	// is waited for them (Drained).
	Exited []string `json:"exited,omitempty"`
}

// State is the batch's state, derived from what it recorded.
func (b RolloutBatch) State() BatchState {
	switch {
	case b.Released:
		return BatchReleased
	case !b.CompletedAt.IsZero():
		return BatchDone
	case !b.TerminatedAt.IsZero():
		return BatchReplacing
	default:
		return BatchDraining
	}
}

func (b RolloutBatch) finished() bool { return b.Released || !b.CompletedAt.IsZero() }

// toReplace is how many of the batch's agents were available when it
// started (NodeIDs not in Exited): each needs a replacement.
func (b RolloutBatch) toReplace() int {
	n := 0
	for _, id := range b.NodeIDs {
		if !slices.Contains(b.Exited, id) {
			n++
		}
	}
	return n
}

// exited is how many of the batch's agents had claimed their exit when it
// started.
func (b RolloutBatch) exited() int { return len(b.NodeIDs) - b.toReplace() }

// Rollout is the persisted desired state of one rollout and where its
// reconciler has got to. The shell stores it as a whole.
type Rollout struct {
	ID string `json:"rollout_id"`
	// Selector picks the agents to replace; TargetSelector what a
	// replacement looks like. An agent matching both is not replaced.
	Selector       string        `json:"selector"`
	TargetSelector string        `json:"target_selector"`
	Batch          int           `json:"batch"`
	MaxUnavailable int           `json:"max_unavailable"`
	BatchDeadline  time.Duration `json:"batch_deadline"`
	DrainWindow    time.Duration `json:"drain_window"`
	ConfirmTimeout time.Duration `json:"confirm_timeout"`
	Description    string        `json:"description,omitempty"`
	RequestedBy    string        `json:"requested_by"`
	CreatedAt      time.Time     `json:"created_at"`
	UpdatedAt      time.Time     `json:"updated_at"`

	State RolloutState `json:"state"`
	// Reason says why the rollout is paused, aborted or completed.
	Reason string `json:"reason,omitempty"`
	// BaselineReady is how many agents matching TargetSelector were ready
	// when the rollout started: they are not replacements.
	BaselineReady int            `json:"baseline_ready"`
	Batches       []RolloutBatch `json:"batches"`
	// ReleasePending: aborted with unfinished batches that the reconciler
	// must still release (see ActRolloutRelease).
	ReleasePending bool `json:"release_pending,omitempty"`

	// Last observed, for GetRollout and WatchRollout.
	Remaining   int `json:"remaining"`
	ReadyTarget int `json:"ready_target"`

	// BaselineReadyBy is when the last of the baseline reported ready (zero:
	// CreatedAt): a vouched agent ready by then may be one of the baseline.
	// Stored only; not sent (GetRollout shows BaselineReady).
	BaselineReadyBy time.Time `json:"baseline_ready_by,omitzero"`

	// Reassigning are the reassignments a batch's handover pass is about
	// to make, written before it makes them: the pass's count is saved
	// after them, and a reassignment the process died between it and
	// that save is counted from its lease (its fresh lease id) by the
	// batch's next pass. Stored only; not sent.
	Reassigning []Reassignment `json:"reassigning,omitempty"`

	// WaitingSince is when the rollout, running with agents left to drain
	// and no batch unfinished, began waiting for the replacements its next
	// batch needs to stay within MaxUnavailable (a replacement counted for
	// a finished batch left since): no batch's deadline bounds that wait,
	// so it is bounded by BatchDeadline from here, and the rollout then
	// pauses saying what is missing. Zero when it is not so waiting; a
	// resume starts the wait afresh. Stored only; not sent.
	WaitingSince time.Time `json:"waiting_since,omitzero"`
}

// Reassignment is a reassignment batch Batch's handover pass is about to
// make (Rollout.Reassigning).
type Reassignment struct {
	Batch int `json:"batch"`
	supervisor.PendingHandover
}

// reassigning returns the reassignments of r.Reassigning that batch b's
// pass wrote down.
func (r Rollout) reassigning(b int) []supervisor.PendingHandover {
	var out []supervisor.PendingHandover
	for _, p := range r.Reassigning {
		if p.Batch == b {
			out = append(out, p.PendingHandover)
		}
	}
	return out
}

// setReassigning replaces batch b's reassignments in r.Reassigning with ps.
func (r *Rollout) setReassigning(b int, ps []supervisor.PendingHandover) {
	kept := r.Reassigning[:0:0]
	for _, p := range r.Reassigning {
		if p.Batch != b {
			kept = append(kept, p)
		}
	}
	for _, p := range ps {
		kept = append(kept, Reassignment{Batch: b, PendingHandover: p})
	}
	if len(kept) == 0 {
		kept = nil
	}
	r.Reassigning = kept
}

// Drained is the number of agents drained by started batches that were
// available when their batch started: each needs a replacement. An agent
// that had claimed its exit (RolloutBatch.Exited) is drained too, but
// nothing of the fleet's went with it: it is not counted, or the rollout
// would wait for a replacement of an agent that had already gone (and
// that its launcher replaced when it saw the exit, if it had one).
func (r Rollout) Drained() int {
	n := 0
	for _, b := range r.Batches {
		n += b.toReplace()
	}
	return n
}

// Exited is the number of agents drained by started batches that had
// claimed their exit before their batch (not counted in Drained).
func (r Rollout) Exited() int {
	n := 0
	for _, b := range r.Batches {
		n += b.exited()
	}
	return n
}

// Replacements is how many replacements are ready: agents matching the
// target selector that are running and ready, beyond the baseline.
func (r Rollout) Replacements(readyTarget int) int { return max(0, readyTarget-r.BaselineReady) }

// Unavailable is how many drained agents are not yet replaced.
func (r Rollout) Unavailable(readyTarget int) int {
	return max(0, r.Drained()-r.Replacements(readyTarget))
}

// LeasesHandedOver totals the leases reassigned to replacements.
func (r Rollout) LeasesHandedOver() int {
	n := 0
	for _, b := range r.Batches {
		n += b.LeasesHandedOver
	}
	return n
}

// Finished reports whether nothing is left for the reconciler to do.
func (r Rollout) Finished() bool { return r.State.Finished() && !r.ReleasePending }

// BatchFacts is what the shell observed about one started, unfinished
// batch: its termination and the leases its agents still hold.
type BatchFacts struct {
	// Marked: the termination has marked its members (they are known).
	Marked bool
	// Terminated: the termination wrote its record (RecordID).
	Terminated bool
	RecordID   string
	// OpenLeases: open leases held by the batch's members that can be
	// handed over (not terminal, no cancel request, no ownership conflict)
	// to a ready replacement with room for them (FullLeases).
	OpenLeases int
	// ConflictedLeases: open leases held by the batch's members with an
	// unresolved ownership conflict. They cannot be handed over, and the
	// batch is not done while any is left: the conflict must be resolved
	// (Reassign or Resolve) first, so the rollout never reports the batch
	// clean over a job whose ownership is in question.
	ConflictedLeases int
	// WaitingLeases: open leases held by the batch's members that no ready
	// replacement may take (none spawned by an ancestor of the job's
	// holder or by an operator, none in a tree an operator registered
	// with the target labels). The batch is not done
	// while any is left, and at its deadline the rollout pauses saying so:
	// a job is never handed to an agent outside its lineage that merely
	// labelled itself a replacement.
	WaitingLeases int
	// FullLeases: open leases held by the batch's members that a ready
	// replacement may take, but none of those has room for (each holds as
	// many open leases as one agent may). The batch is not done while any
	// is left, and at its deadline the rollout pauses saying so.
	FullLeases int
}

// RolloutFacts is the control plane's view, read from stored state by the
// shell before each step. Nothing in it is an agent's own claim: readiness
// is what the store says about registered, running nodes.
type RolloutFacts struct {
	// Candidates are the next agents to drain, in the order to drain them:
	// matching the selector and not the target selector, not terminated
	// and no other termination's but an agent's stopping them (running,
	// exited outside any termination, or under an agent's termination),
	// with no ancestor among the candidates, not in a started batch. At
	// least Batch of them when there are that many.
	Candidates []string
	// Remaining is how many candidates there are in all.
	Remaining int
	// ReadyTarget: running agents matching the target selector that
	// reported ready (those counted as replacements), plus the baseline
	// agents no longer ready: it is compared with BaselineReady, which a
	// baseline agent leaving must not lower the count below.
	ReadyTarget int
	// Batches holds the facts of every started, unfinished batch by index.
	Batches map[int]BatchFacts
}

// RolloutAction is the one piece of work the reconciler must do (and
// persist) to move a rollout on. Every action is idempotent in the shell.
type RolloutAction int

const (
	// ActRolloutWait: nothing to do until a fact changes or Wake.
	ActRolloutWait RolloutAction = iota
	// ActRolloutStartBatch writes the next batch and its termination (one
	// transaction): Nodes are drained together, one record.
	ActRolloutStartBatch
	// ActRolloutNoteTerminated: the batch's termination wrote its record.
	ActRolloutNoteTerminated
	// ActRolloutNoteReplaced: enough replacements are ready to cover the
	// batch (and every earlier one).
	ActRolloutNoteReplaced
	// ActRolloutHandOver reassigns the batch's open leases to ready
	// replacements with generation + 1.
	ActRolloutHandOver
	// ActRolloutCompleteBatch: terminated, replaced, handed over.
	ActRolloutCompleteBatch
	// ActRolloutPause: a batch missed its deadline (Reason says how).
	ActRolloutPause
	// ActRolloutComplete: every agent was replaced.
	ActRolloutComplete
	// ActRolloutRelease: the rollout was aborted; every unfinished batch's
	// leases are reconciled as a plain termination's (cancelled and
	// explicitly resolved) instead of handed over.
	ActRolloutRelease
	// ActRolloutNone: the rollout is finished.
	ActRolloutNone
)

var rolloutActionNames = [...]string{"wait", "start_batch", "note_terminated", "note_replaced", "hand_over", "complete_batch", "pause", "complete", "release", "none"}

func (a RolloutAction) String() string {
	return enumname.Of(rolloutActionNames[:], a, "rollout_action")
}

// RolloutStep is a decision of NextRollout.
type RolloutStep struct {
	Action RolloutAction
	// Batch is the batch the action is about (StartBatch: the new one).
	Batch int
	// Nodes are the agents StartBatch drains.
	Nodes []string
	// Reason explains a pause.
	Reason string
	// Wake is when to look again if nothing changes (zero: no timer).
	Wake time.Time
	// Waiting (a Wait): no batch is unfinished and the next cannot start
	// for want of replacements (Rollout.WaitingSince).
	Waiting bool
}

// RolloutOutcome is what the shell reports after performing a step.
type RolloutOutcome struct {
	// TerminationID: StartBatch's termination.
	TerminationID string
	// Exited: those of StartBatch's nodes whose exit was claimed when the
	// batch started (RolloutBatch.Exited).
	Exited []string
	// HandedOver and NotHandedOver: a HandOver's results ("job: why").
	HandedOver    int
	NotHandedOver []string
	// Reassigning: a HandOver's reassignments still in doubt (one the
	// lease module failed to answer may have been made), for the next
	// pass to count from their leases.
	Reassigning []supervisor.PendingHandover
}

// NextRollout decides the rollout's next action from its stored state and
// the observed facts at now. It is pure: the reconciler performs the
// action, then calls AdvanceRollout to record it.
//
// Finishing started batches comes first, then the deadline, then a new
// batch. A batch starts only while the rollout runs, no other batch's
// termination is still running, and the agents drained and not yet
// replaced, counting the new batch, stay within MaxUnavailable. With
// MaxUnavailable equal to Batch (the default), that means every earlier
// batch's replacements are ready.
func NextRollout(r Rollout, f RolloutFacts, now time.Time) RolloutStep {
	if r.State.Finished() {
		if r.ReleasePending {
			return RolloutStep{Action: ActRolloutRelease}
		}
		return RolloutStep{Action: ActRolloutNone}
	}
	replacements := r.Replacements(f.ReadyTarget)
	covered := 0
	terminating := false
	for _, b := range r.Batches {
		covered += b.toReplace()
		if b.finished() {
			continue
		}
		bf := f.Batches[b.Index]
		switch {
		case b.TerminatedAt.IsZero() && bf.Terminated:
			return RolloutStep{Action: ActRolloutNoteTerminated, Batch: b.Index}
		case b.ReplacedAt.IsZero() && replacements >= covered:
			return RolloutStep{Action: ActRolloutNoteReplaced, Batch: b.Index}
		case !b.ReplacedAt.IsZero() && bf.Marked && (!b.HandedOver || bf.OpenLeases > 0 || len(r.reassigning(b.Index)) > 0):
			return RolloutStep{Action: ActRolloutHandOver, Batch: b.Index}
		case !b.TerminatedAt.IsZero() && !b.ReplacedAt.IsZero() && b.HandedOver && bf.OpenLeases == 0 && bf.ConflictedLeases == 0 && bf.WaitingLeases == 0 && bf.FullLeases == 0:
			return RolloutStep{Action: ActRolloutCompleteBatch, Batch: b.Index}
		}
		if b.TerminatedAt.IsZero() {
			terminating = true
		}
	}
	var wake time.Time
	if r.State == RolloutRunning {
		for _, b := range r.Batches {
			if b.finished() {
				continue
			}
			if !now.Before(b.Deadline) {
				return RolloutStep{Action: ActRolloutPause, Batch: b.Index, Reason: missedDeadline(r, b, f, replacements)}
			}
			if wake.IsZero() || b.Deadline.Before(wake) {
				wake = b.Deadline
			}
		}
	}
	unfinished := false
	for _, b := range r.Batches {
		unfinished = unfinished || !b.finished()
	}
	if r.State == RolloutRunning && !terminating && f.Remaining > 0 && len(f.Candidates) > 0 {
		size := min(r.Batch, len(f.Candidates))
		if r.Unavailable(f.ReadyTarget)+size <= r.MaxUnavailable {
			return RolloutStep{Action: ActRolloutStartBatch, Batch: len(r.Batches), Nodes: append([]string(nil), f.Candidates[:size]...)}
		}
		if !unfinished {
			// Every batch is done, yet the replacements counted for them
			// are no longer all ready (one left after its batch was done:
			// a rogue's replacement claiming its exit once it had been
			// counted, say). No batch's deadline bounds this wait: until
			// the forty-eighth hostile pass the rollout stayed running
			// here, saying nothing, for as long as nobody looked. It
			// waits one batch deadline, then pauses saying what is
			// missing.
			if r.WaitingSince.IsZero() {
				return RolloutStep{Action: ActRolloutWait, Wake: now.Add(r.BatchDeadline), Waiting: true}
			}
			deadline := r.WaitingSince.Add(r.BatchDeadline)
			if !now.Before(deadline) {
				return RolloutStep{Action: ActRolloutPause, Batch: len(r.Batches), Reason: cannotStart(r, f, replacements, size)}
			}
			return RolloutStep{Action: ActRolloutWait, Wake: deadline, Waiting: true}
		}
	}
	if r.State == RolloutRunning && f.Remaining == 0 && !unfinished {
		return RolloutStep{Action: ActRolloutComplete}
	}
	return RolloutStep{Action: ActRolloutWait, Wake: wake}
}

// missedDeadline explains what a batch was still waiting for.
func missedDeadline(r Rollout, b RolloutBatch, f RolloutFacts, replacements int) string {
	var waiting []string
	if b.TerminatedAt.IsZero() {
		waiting = append(waiting, fmt.Sprintf("its termination %s has not finished", b.TerminationID))
	}
	covered := 0
	for _, o := range r.Batches {
		if o.Index <= b.Index {
			covered += o.toReplace()
		}
	}
	if b.ReplacedAt.IsZero() {
		waiting = append(waiting, fmt.Sprintf("%d of %d replacements matching %q are ready", replacements, covered, r.TargetSelector))
	} else if open := f.Batches[b.Index].OpenLeases; open > 0 {
		waiting = append(waiting, fmt.Sprintf("%d leases are not handed over yet", open))
	}
	if w := f.Batches[b.Index].WaitingLeases; w > 0 {
		waiting = append(waiting, fmt.Sprintf("%d leases wait for a ready replacement spawned by an ancestor of their holder or by an operator, or in a tree registered with labels %q", w, r.TargetSelector))
	}
	if full := f.Batches[b.Index].FullLeases; full > 0 {
		waiting = append(waiting, fmt.Sprintf("%d leases wait for room: every ready replacement that may take them holds as many open leases as one agent may", full))
	}
	if conflicted := f.Batches[b.Index].ConflictedLeases; conflicted > 0 {
		waiting = append(waiting, fmt.Sprintf("%d leases have an unresolved ownership conflict and cannot be handed over; resolve them (lease reassign or resolve)", conflicted))
	}
	return fmt.Sprintf("batch %d missed its deadline (%s after it started): %s", b.Index, r.BatchDeadline, strings.Join(waiting, "; "))
}

// cannotStart explains why the next batch could not start within a batch
// deadline after every earlier one was done.
func cannotStart(r Rollout, f RolloutFacts, replacements, size int) string {
	return fmt.Sprintf("batch %d cannot start: %d of %d replacements matching %q are ready for the %d agents drained by batches 0 to %d, and draining %d more would leave %d unavailable, beyond max_unavailable %d (waited %s)",
		len(r.Batches), replacements, r.Drained(), r.TargetSelector, r.Drained(), len(r.Batches)-1, size, r.Unavailable(f.ReadyTarget)+size, r.MaxUnavailable, r.BatchDeadline)
}

// AdvanceRollout records that step was performed at now (with the shell's
// outcome) and returns the new state. It is the one function through which
// the reconciler changes a rollout, and refuses steps that do not fit.
func AdvanceRollout(r Rollout, step RolloutStep, out RolloutOutcome, f RolloutFacts, now time.Time) (Rollout, error) {
	r.Batches = append([]RolloutBatch(nil), r.Batches...)
	r.Remaining, r.ReadyTarget = f.Remaining, f.ReadyTarget
	batch := func() (*RolloutBatch, error) {
		if step.Batch < 0 || step.Batch >= len(r.Batches) || r.Batches[step.Batch].finished() {
			return nil, fmt.Errorf("supervisor: rollout %s: %s of batch %d, which is not an unfinished batch", r.ID, step.Action, step.Batch)
		}
		return &r.Batches[step.Batch], nil
	}
	switch step.Action {
	case ActRolloutWait:
		switch {
		case step.Waiting && r.WaitingSince.IsZero():
			r.WaitingSince = now
		case !step.Waiting:
			r.WaitingSince = time.Time{}
		}
		return r, nil
	case ActRolloutNone:
		return r, nil
	case ActRolloutStartBatch:
		if r.State != RolloutRunning || step.Batch != len(r.Batches) || len(step.Nodes) == 0 || out.TerminationID == "" {
			return r, fmt.Errorf("supervisor: rollout %s: cannot start batch %d while %s", r.ID, step.Batch, r.State)
		}
		for _, n := range out.Exited {
			if !slices.Contains(step.Nodes, n) {
				return r, fmt.Errorf("supervisor: rollout %s: batch %d does not drain %s, which it lists as exited", r.ID, step.Batch, n)
			}
		}
		r.Batches = append(r.Batches, RolloutBatch{
			Index: step.Batch, NodeIDs: append([]string(nil), step.Nodes...), TerminationID: out.TerminationID,
			Exited: slices.Clone(out.Exited), StartedAt: now, Deadline: now.Add(r.BatchDeadline),
		})
		r.Remaining = max(0, r.Remaining-len(step.Nodes))
		r.WaitingSince = time.Time{}
	case ActRolloutNoteTerminated:
		b, err := batch()
		if err != nil {
			return r, err
		}
		b.TerminatedAt = now
		b.RecordID = f.Batches[b.Index].RecordID
	case ActRolloutNoteReplaced:
		b, err := batch()
		if err != nil {
			return r, err
		}
		b.ReplacedAt = now
	case ActRolloutHandOver:
		b, err := batch()
		if err != nil {
			return r, err
		}
		if b.ReplacedAt.IsZero() {
			return r, fmt.Errorf("supervisor: rollout %s: batch %d is not replaced yet; its leases have nobody to go to", r.ID, b.Index)
		}
		b.HandedOver = true
		b.LeasesHandedOver += out.HandedOver
		r.setReassigning(b.Index, out.Reassigning) // the others were counted in out, or not made
		b.LeasesNotHandedOver = mergeSorted(b.LeasesNotHandedOver, out.NotHandedOver)
	case ActRolloutCompleteBatch:
		b, err := batch()
		if err != nil {
			return r, err
		}
		if b.TerminatedAt.IsZero() || b.ReplacedAt.IsZero() || !b.HandedOver {
			return r, fmt.Errorf("supervisor: rollout %s: batch %d is not terminated, replaced and handed over", r.ID, b.Index)
		}
		b.CompletedAt = now
	case ActRolloutPause:
		if r.State != RolloutRunning {
			return r, fmt.Errorf("supervisor: rollout %s: cannot pause while %s", r.ID, r.State)
		}
		r.State, r.Reason = RolloutPaused, step.Reason
		r.WaitingSince = time.Time{}
	case ActRolloutComplete:
		if r.State != RolloutRunning {
			return r, fmt.Errorf("supervisor: rollout %s: cannot complete while %s", r.ID, r.State)
		}
		for _, b := range r.Batches {
			if !b.finished() {
				return r, fmt.Errorf("supervisor: rollout %s: batch %d is unfinished", r.ID, b.Index)
			}
		}
		r.State = RolloutCompleted
		r.Reason = fmt.Sprintf("%d agents replaced in %d batches", r.Drained(), len(r.Batches))
		if n := r.Exited(); n > 0 {
			r.Reason += fmt.Sprintf("; %d more had claimed their exit before their batch and were drained without a replacement (their batches' records weigh the claims)", n)
		}
		var stuck []string
		for _, b := range r.Batches {
			stuck = append(stuck, b.LeasesNotHandedOver...)
		}
		if len(stuck) > 0 {
			r.Reason += fmt.Sprintf("; %d leases were not handed over by the rollout (%s)", len(stuck), strings.Join(stuck, "; "))
		}
	case ActRolloutRelease:
		if r.State != RolloutAborted || !r.ReleasePending {
			return r, fmt.Errorf("supervisor: rollout %s: nothing to release while %s", r.ID, r.State)
		}
		for i := range r.Batches {
			if !r.Batches[i].finished() {
				r.Batches[i].Released = true
			}
		}
		r.ReleasePending = false
	default:
		return r, fmt.Errorf("supervisor: rollout %s: action %s is not allowed", r.ID, step.Action)
	}
	r.UpdatedAt = now
	return r, nil
}

// RolloutDecision is an operator's decision about a rollout.
type RolloutDecision int

const (
	DecidePause RolloutDecision = iota + 1
	DecideResume
	DecideAbort
)

func (d RolloutDecision) String() string {
	switch d {
	case DecidePause:
		return "pause"
	case DecideResume:
		return "resume"
	case DecideAbort:
		return "abort"
	default:
		return fmt.Sprintf("rollout_decision(%d)", int(d))
	}
}

// DecideRollout applies an operator's pause, resume or abort at now. A
// decision that repeats the current state changes nothing (changed is
// false). Resuming gives every unfinished batch a fresh deadline: the time
// spent paused does not count against it.
func DecideRollout(r Rollout, d RolloutDecision, reason, by string, now time.Time) (next Rollout, changed bool, err error) {
	if len(reason) > 1024 {
		return r, false, fmt.Errorf("%w: reason is longer than 1024 bytes", tree.ErrInvalidArgument)
	}
	who := by
	if reason != "" {
		who = by + ": " + reason
	}
	switch {
	case d == DecideAbort && r.State == RolloutAborted,
		d == DecidePause && r.State == RolloutPaused,
		d == DecideResume && r.State == RolloutRunning:
		return r, false, nil
	case r.State.Finished():
		return r, false, fmt.Errorf("%w: rollout %s is %s; it cannot %s", ErrRolloutFinished, r.ID, r.State, d)
	}
	r.Batches = append([]RolloutBatch(nil), r.Batches...)
	switch d {
	case DecidePause:
		r.State, r.Reason = RolloutPaused, "paused by "+who
	case DecideResume:
		r.State, r.Reason, r.WaitingSince = RolloutRunning, "", time.Time{}
		for i := range r.Batches {
			if !r.Batches[i].finished() {
				r.Batches[i].Deadline = now.Add(r.BatchDeadline)
			}
		}
	case DecideAbort:
		r.State, r.Reason = RolloutAborted, "aborted by "+who
		for _, b := range r.Batches {
			r.ReleasePending = r.ReleasePending || !b.finished()
		}
	default:
		return r, false, fmt.Errorf("%w: unknown decision %d", tree.ErrInvalidArgument, int(d))
	}
	r.UpdatedAt = now
	return r, true, nil
}

// Rollout limits and defaults.
const (
	DefaultBatchDeadline = 10 * time.Minute
	MaxRolloutBatch      = supervisor.MaxTerminationRoots
)

// RolloutRequest is an authenticated request to start a rollout.
type RolloutRequest struct {
	Selector, TargetSelector string
	Batch, MaxUnavailable    int
	BatchDeadline            time.Duration
	// DrainWindow and ConfirmTimeout of each batch's termination.
	DrainWindow, ConfirmTimeout time.Duration
	Description                 string
	RequestedBy                 string
}

// NewRollout validates a request and returns the rollout's initial state.
// Zero Batch means 1, zero MaxUnavailable means Batch, zero BatchDeadline
// means DefaultBatchDeadline.
func NewRollout(rolloutID string, req RolloutRequest, baselineReady int, now time.Time) (Rollout, error) {
	sel, err := tree.ParseSelector(req.Selector)
	if err != nil {
		return Rollout{}, err
	}
	target, err := tree.ParseSelector(req.TargetSelector)
	if err != nil {
		return Rollout{}, fmt.Errorf("%w (target_selector)", err)
	}
	switch {
	case len(sel) == 0:
		return Rollout{}, fmt.Errorf("%w: selector is required (a rollout of every agent is not a rollout)", tree.ErrInvalidArgument)
	case len(target) == 0:
		return Rollout{}, fmt.Errorf("%w: target_selector is required: it is how replacements are recognised", tree.ErrInvalidArgument)
	case selectorSubset(target, sel):
		return Rollout{}, fmt.Errorf("%w: every agent matching target_selector %q also matches selector %q: a replacement would be replaced in turn", tree.ErrInvalidArgument, req.TargetSelector, req.Selector)
	}
	batch, maxUnavailable := req.Batch, req.MaxUnavailable
	if batch == 0 {
		batch = 1
	}
	if maxUnavailable == 0 {
		maxUnavailable = batch
	}
	deadline := req.BatchDeadline
	if deadline == 0 {
		deadline = DefaultBatchDeadline
	}
	switch {
	case batch < 0 || batch > MaxRolloutBatch:
		return Rollout{}, fmt.Errorf("%w: batch must be between 1 and %d", tree.ErrInvalidArgument, MaxRolloutBatch)
	case maxUnavailable < batch:
		return Rollout{}, fmt.Errorf("%w: max_unavailable (%d) must be at least batch (%d): one batch alone makes batch agents unavailable", tree.ErrInvalidArgument, maxUnavailable, batch)
	case req.DrainWindow < 0 || req.DrainWindow > supervisor.MaxTerminationWindow || req.ConfirmTimeout < 0 || req.ConfirmTimeout > supervisor.MaxTerminationWindow:
		return Rollout{}, fmt.Errorf("%w: drain_window and confirm_timeout must be between 0 and %s", tree.ErrInvalidArgument, supervisor.MaxTerminationWindow)
	case deadline < 0 || deadline > supervisor.MaxTerminationWindow:
		return Rollout{}, fmt.Errorf("%w: batch_deadline must be between 0 and %s", tree.ErrInvalidArgument, supervisor.MaxTerminationWindow)
	case deadline <= req.DrainWindow+supervisor.DefaultCancelAckTimeout+req.ConfirmTimeout:
		return Rollout{}, fmt.Errorf("%w: batch_deadline %s is too short: a batch's termination alone may take drain_window + %s + confirm_timeout = %s", tree.ErrInvalidArgument,
			deadline, supervisor.DefaultCancelAckTimeout, req.DrainWindow+supervisor.DefaultCancelAckTimeout+req.ConfirmTimeout)
	case len(req.Description) > 1024:
		return Rollout{}, fmt.Errorf("%w: description is longer than 1024 bytes", tree.ErrInvalidArgument)
	}
	return Rollout{
		ID: rolloutID, Selector: FormatSelector(sel), TargetSelector: FormatSelector(target),
		Batch: batch, MaxUnavailable: maxUnavailable, BatchDeadline: deadline,
		DrainWindow: req.DrainWindow, ConfirmTimeout: req.ConfirmTimeout,
		Description: req.Description, RequestedBy: req.RequestedBy,
		CreatedAt: now, UpdatedAt: now, State: RolloutRunning, BaselineReady: baselineReady,
	}, nil
}

// selectorSubset reports whether every agent matching a matches b too
// (b's pairs are all in a).
func selectorSubset(a, b map[string]string) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// FormatSelector renders a selector canonically ("k=v,k2=v2", keys sorted).
func FormatSelector(sel map[string]string) string {
	return sortedmap.Join(sel, "", ",", func(k, v string) string { return k + "=" + v })
}

func mergeSorted(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string(nil), a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
