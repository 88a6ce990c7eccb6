package supervisor

import (
	"fmt"
	"time"
)

// Phase is a termination's state: requested → draining | aborting →
// reconciling → terminated.
type Phase int

const (
	PhaseRequested Phase = iota + 1
	PhaseDraining
	PhaseAborting
	PhaseReconciling
	PhaseTerminated
)

func (p Phase) String() string {
	switch p {
	case PhaseRequested:
		return "requested"
	case PhaseDraining:
		return "draining"
	case PhaseAborting:
		return "aborting"
	case PhaseReconciling:
		return "reconciling"
	case PhaseTerminated:
		return "terminated"
	default:
		return fmt.Sprintf("phase(%d)", int(p))
	}
}

// Mode is how a termination treats in-flight tool calls.
type Mode int

const (
	// ModeDrain rejects new calls and lets in-flight ones finish within the
	// drain window, then escalates what is left to abort.
	ModeDrain Mode = iota + 1
	// ModeAbort cancels in-flight calls at once and waits for each cancel's
	// acknowledgement up to the cancel-ack timeout.
	ModeAbort
)

func (m Mode) String() string {
	switch m {
	case ModeDrain:
		return "drain"
	case ModeAbort:
		return "abort"
	default:
		return fmt.Sprintf("mode(%d)", int(m))
	}
}

// Action is the one piece of work the reconciler must do (and persist) to
// move a termination on. Every action is idempotent in the shell.
type Action int

const (
	// ActWait: nothing to do until a fact changes or the returned deadline.
	ActWait Action = iota
	// ActMark marks the whole subtree draining or aborting in one
	// transaction and signals the sessions.
	ActMark
	// ActEndDrain: every in-flight call finished inside the drain window.
	ActEndDrain
	// ActEscalate: the drain outlasted its window; cancel what is left.
	ActEscalate
	// ActCancelCalls sends a cancel order for every in-flight call.
	ActCancelCalls
	// ActRevoke revokes the subtree's grants (one tombstone per top grant),
	// its privileges and cancels its job leases.
	ActRevoke
	// ActWriteRecord writes the reconciliation record and terminates.
	ActWriteRecord
	// ActNone: the termination is finished.
	ActNone
)

func (a Action) String() string {
	return [...]string{"wait", "mark", "end_drain", "escalate", "cancel_calls", "revoke", "write_record", "none"}[a]
}

// PhaseTiming is when a phase began (and, once left, how long it lasted).
type PhaseTiming struct {
	Phase     Phase         `json:"phase"`
	StartedAt time.Time     `json:"started_at"`
	Duration  time.Duration `json:"duration"`
}

// Progress is the control plane's view of the subtree, read from stored
// state by the shell before each step. The agent's own claims are never
// facts: only the ledger, the tree and confirmations are.
type Progress struct {
	// CallsInFlight: calls begun and not ended, with no cancel order yet.
	CallsInFlight int
	// CancelsPending: calls with a cancel order and neither an ack nor an end.
	CancelsPending int
	// Unconfirmed: nodes of the subtree whose exit nobody has confirmed.
	Unconfirmed int
}

// Termination is the persisted desired state of one termination and where
// the reconciler has got to. The shell stores it as a whole.
type Termination struct {
	ID               string        `json:"termination_id"`
	NodeID           string        `json:"node_id"`
	Mode             Mode          `json:"mode"`
	DrainWindow      time.Duration `json:"drain_window"`
	CancelAckTimeout time.Duration `json:"cancel_ack_timeout"`
	ConfirmTimeout   time.Duration `json:"confirm_timeout"`
	Reason           string        `json:"reason"`
	RequestedBy      string        `json:"requested_by"`
	RequestedAt      time.Time     `json:"requested_at"`
	UpdatedAt        time.Time     `json:"updated_at"`

	Phase     Phase         `json:"phase"`
	Escalated bool          `json:"escalated"`
	Phases    []PhaseTiming `json:"phases"`

	// Roots are the subtree roots when there are several (a rollout
	// batch); NodeID is the first. Empty for one root.
	Roots []string `json:"roots,omitempty"`
	// RolloutID is the rollout this termination is a batch of;
	// LeaseHandover leaves the subtrees' job leases open for that rollout
	// to reassign, instead of cancelling them.
	RolloutID     string `json:"rollout_id,omitempty"`
	LeaseHandover bool   `json:"lease_handover,omitempty"`
	// ProposalID is the stop proposal whose approval started the
	// termination; the record names the stop rule that filed it, if any.
	ProposalID string `json:"proposal_id,omitempty"`

	// Members is the subtree as marked, root first; nodes spawned before
	// the mark are included, after it refused.
	Members []string `json:"members"`
	// Deadlines, on the coordinator's clock.
	DrainDeadline   time.Time `json:"drain_deadline,omitzero"`
	CancelDeadline  time.Time `json:"cancel_deadline,omitzero"`
	ConfirmDeadline time.Time `json:"confirm_deadline,omitzero"`
	// Steps done, so a restarted reconciler never repeats them.
	CancelsSent bool   `json:"cancels_sent"`
	Revoked     bool   `json:"revoked"`
	RecordID    string `json:"record_id,omitempty"`
	// Progress last observed (for GetTermination / WatchTermination).
	Progress Progress `json:"progress"`
}

// RootIDs are the termination's subtree roots.
func (t Termination) RootIDs() []string {
	if len(t.Roots) > 0 {
		return t.Roots
	}
	return []string{t.NodeID}
}

// Next decides the termination's next action from its stored state and the
// observed progress at now. It is pure: the reconciler performs the action,
// then calls Advance to record it. wake is when to look again if nothing
// changes (zero: no timer needed).
func Next(t Termination, p Progress, now time.Time) (action Action, wake time.Time) {
	switch t.Phase {
	case PhaseRequested:
		return ActMark, time.Time{}
	case PhaseDraining:
		if p.CallsInFlight == 0 {
			return ActEndDrain, time.Time{}
		}
		if !now.Before(t.DrainDeadline) {
			return ActEscalate, time.Time{}
		}
		return ActWait, t.DrainDeadline
	case PhaseAborting:
		if !t.CancelsSent {
			return ActCancelCalls, time.Time{}
		}
		if p.CancelsPending == 0 || !now.Before(t.CancelDeadline) {
			return ActRevoke, time.Time{}
		}
		return ActWait, t.CancelDeadline
	case PhaseReconciling:
		if !t.Revoked {
			return ActRevoke, time.Time{}
		}
		if p.Unconfirmed == 0 || !now.Before(t.ConfirmDeadline) {
			return ActWriteRecord, time.Time{}
		}
		return ActWait, t.ConfirmDeadline
	default:
		return ActNone, time.Time{}
	}
}

// Advance records that action was performed at now and returns the new
// state. It is the one function through which a termination changes phase
// and refuses actions that do not fit the phase.
func Advance(t Termination, action Action, p Progress, now time.Time) (Termination, error) {
	t.Progress = p
	t.UpdatedAt = now
	switch {
	case action == ActMark && t.Phase == PhaseRequested:
		if t.Mode == ModeAbort {
			t = enter(t, PhaseAborting, now)
			t.CancelDeadline = now.Add(t.CancelAckTimeout)
		} else {
			t = enter(t, PhaseDraining, now)
			t.DrainDeadline = now.Add(t.DrainWindow)
		}
	case action == ActEndDrain && t.Phase == PhaseDraining:
		t = enter(t, PhaseReconciling, now)
	case action == ActEscalate && t.Phase == PhaseDraining:
		// The shell sent the cancel orders with the escalation.
		t.Escalated = true
		t = enter(t, PhaseAborting, now)
		t.CancelDeadline = now.Add(t.CancelAckTimeout)
		t.CancelsSent = true
	case action == ActCancelCalls && t.Phase == PhaseAborting:
		t.CancelsSent = true
	case action == ActRevoke && (t.Phase == PhaseAborting || t.Phase == PhaseReconciling):
		if t.Phase == PhaseAborting {
			t = enter(t, PhaseReconciling, now)
		}
		if t.Revoked {
			break
		}
		t.Revoked = true
		t.ConfirmDeadline = now.Add(t.ConfirmTimeout)
	case action == ActWriteRecord && t.Phase == PhaseReconciling && t.Revoked:
		t = enter(t, PhaseTerminated, now)
	case action == ActWait:
	default:
		return t, fmt.Errorf("supervisor: action %s is not allowed in phase %s", action, t.Phase)
	}
	return t, nil
}

// enter closes the current phase's timing and opens the next.
func enter(t Termination, next Phase, now time.Time) Termination {
	phases := append([]PhaseTiming(nil), t.Phases...)
	if n := len(phases); n > 0 && phases[n-1].Duration == 0 {
		phases[n-1].Duration = now.Sub(phases[n-1].StartedAt)
	}
	if next != PhaseTerminated {
		phases = append(phases, PhaseTiming{Phase: next, StartedAt: now})
	}
	t.Phases = phases
	t.Phase = next
	return t
}

// NewTermination validates a request and returns the requested state.
func NewTermination(id, nodeID string, mode Mode, drain, cancelAck, confirm time.Duration, reason, requestedBy string, now time.Time) (Termination, error) {
	if mode != ModeDrain && mode != ModeAbort {
		return Termination{}, fmt.Errorf("%w: mode must be drain or abort", ErrInvalidArgument)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"drain_window", drain}, {"cancel_ack_timeout", cancelAck}, {"confirm_timeout", confirm}} {
		if d.v < 0 || d.v > MaxTerminationWindow {
			return Termination{}, fmt.Errorf("%w: %s must be between 0 and %s", ErrInvalidArgument, d.name, MaxTerminationWindow)
		}
	}
	if len(reason) > 1024 {
		return Termination{}, fmt.Errorf("%w: reason is longer than 1024 bytes", ErrInvalidArgument)
	}
	t := Termination{
		ID: id, NodeID: nodeID, Mode: mode, DrainWindow: drain, CancelAckTimeout: cancelAck,
		ConfirmTimeout: confirm, Reason: reason, RequestedBy: requestedBy, RequestedAt: now, UpdatedAt: now,
	}
	return enter(t, PhaseRequested, now), nil
}

// MaxTerminationWindow bounds each of a termination's windows.
const MaxTerminationWindow = 24 * time.Hour
