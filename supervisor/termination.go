package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/enumname"
	"github.com/tetherhq/tether/supervisor/tree"
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

var phaseNames = [...]string{
	PhaseRequested:   "requested",
	PhaseDraining:    "draining",
	PhaseAborting:    "aborting",
	PhaseReconciling: "reconciling",
	PhaseTerminated:  "terminated",
}

func (p Phase) String() string { return enumname.Of(phaseNames[:], p, "phase") }

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

var modeNames = [...]string{ModeDrain: "drain", ModeAbort: "abort"}

func (m Mode) String() string { return enumname.Of(modeNames[:], m, "mode") }

// Action is the one piece of work the reconciler must do (and persist) to
// move a termination on. Every action is idempotent in the shell.
type Action int

const (
	// ActWait: nothing to do until a fact changes or the returned deadline.
	ActWait Action = iota
	// ActMark marks the whole subtree draining or aborting, top down, in
	// bounded chunks (chunks.go), and signals the sessions.
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

var actionNames = [...]string{"wait", "mark", "end_drain", "escalate", "cancel_calls", "revoke", "write_record", "none"}

func (a Action) String() string { return enumname.Of(actionNames[:], a, "action") }

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
	// HooksPending: privileges of the subtree whose revocation (a revoke
	// webhook or an in-process handler, called off the reconciler's path)
	// has not answered yet.
	HooksPending int
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
	// Tree is the root of the tree NodeID is in (NodeID itself for a
	// tree's root): the reconcile loop serves the trees' terminations in
	// turn. Empty for a termination stored before it was kept.
	Tree string `json:"tree,omitempty"`
	// RolloutID is the rollout this termination is a batch of;
	// LeaseHandover leaves the subtrees' job leases open for that rollout
	// to reassign, instead of cancelling them.
	RolloutID     string `json:"rollout_id,omitempty"`
	LeaseHandover bool   `json:"lease_handover,omitempty"`
	// RequesterLineage is the requesting agent's ancestors and itself,
	// root first (empty for operators): an agent's termination supersedes
	// another agent's only when it is that agent's or an ancestor's. A
	// stop an agent proposed for itself and the policy approved carries
	// the proposer's lineage, and an agent's authority.
	RequesterLineage []string `json:"requester_lineage,omitempty"`
	// ProposalID is the stop proposal whose approval started the
	// termination; the record names the stop rule that filed it, if any.
	ProposalID string `json:"proposal_id,omitempty"`
	// AgentWindows: the windows are an agent's own choice (the stop it
	// proposed for itself, approved), not its approver's; they bind no
	// later stop that takes the node over (Inherit).
	AgentWindows bool `json:"agent_windows,omitempty"`
	// ProposerLineage is, for an agent's own approved stop proposal
	// (AgentWindows), the proposing agent's ancestors and itself, root
	// first. Its ancestors may take the stop over (Supersedes) whoever
	// approved it, bound by its deadlines (Inherit): an operator's
	// approval says "stop it", not "with this agent's window, and let
	// nobody below the operator stop it harder".
	ProposerLineage []string `json:"proposer_lineage,omitempty"`

	// Members is the subtree as marked, root first; nodes spawned before
	// the mark are included, after it refused.
	Members []string `json:"members"`
	// Deadlines, on the coordinator's clock.
	DrainDeadline   time.Time `json:"drain_deadline,omitzero"`
	CancelDeadline  time.Time `json:"cancel_deadline,omitzero"`
	ConfirmDeadline time.Time `json:"confirm_deadline,omitzero"`
	// KeptDrainDeadline and KeptCancelDeadline are the earliest deadlines
	// of the terminations this one took nodes over from, when those were
	// requested by the same authority (Inherit): a repeated or overlapping
	// stop never gives a call more time than the stop already on it had
	// left. The mark's deadlines are no later than these (zero: none).
	KeptDrainDeadline  time.Time `json:"kept_drain_deadline,omitzero"`
	KeptCancelDeadline time.Time `json:"kept_cancel_deadline,omitzero"`
	// KeptConfirmDeadline and KeptHookDeadline, likewise: a repeat taking
	// over a termination that is reconciling does not postpone its record.
	KeptConfirmDeadline time.Time `json:"kept_confirm_deadline,omitzero"`
	KeptHookDeadline    time.Time `json:"kept_hook_deadline,omitzero"`
	// Steps done, so a restarted reconciler never repeats them.
	CancelsSent bool   `json:"cancels_sent"`
	Revoked     bool   `json:"revoked"`
	RecordID    string `json:"record_id,omitempty"`
	// HookTimeout bounds, in total, the privilege revocations started at
	// ActRevoke; HookDeadline is when the record stops waiting for them
	// (what has not answered is revoke_failed). Zero: no wait.
	HookTimeout  time.Duration `json:"hook_timeout,omitempty"`
	HookDeadline time.Time     `json:"hook_deadline,omitzero"`

	// Terminations compose (see Supersedes). TakenOver: members this
	// termination took over from another that was stopping them.
	// HandedOver: nodes of the subtree another termination accounts for
	// (it took them over from this one, or it had them first and this one
	// may not take them). Prior: nodes an earlier termination had already
	// terminated when this one marked. Each node of the subtree is in
	// exactly one of Members, HandedOver and Prior.
	//
	// These lists (and Members) are how terminations stored before the
	// subtree index kept their subtree; an Indexed termination lists it
	// node by node in the store instead (chunks.go) and keeps only the
	// counts and the other terminations' ids here, so that the stored
	// termination stays small whatever the subtree's size.
	TakenOver  []Handoff `json:"taken_over,omitempty"`
	HandedOver []Handoff `json:"handed_over,omitempty"`
	Prior      []Handoff `json:"prior,omitempty"`
	// Indexed: the subtree is listed in the subtree index (chunks.go);
	// Members, TakenOver, HandedOver and Prior stay empty.
	Indexed bool `json:"indexed,omitempty"`
	// Counts counts the subtree index's lists.
	Counts Counts `json:"counts,omitzero"`
	// HeldIndexed: the revocation listed, chunk by chunk, the grants and
	// privileges its members hold in the held index (chunks.go), and the
	// steps after it read them there. (A termination whose revocation
	// began before the held index lists them node by node, as it did.)
	HeldIndexed bool `json:"held_indexed,omitempty"`
	// MembersIntact: no member of the subtree index has been taken over
	// by another termination since the mark listed it, so each still
	// names this one. The mark's first chunk sets it and HandOver clears
	// it (a version that does not know it drops it when it writes the
	// termination); while it holds, the steps that act on the members
	// take them from the index without reading their nodes.
	MembersIntact bool `json:"members_intact,omitempty"`
	// CancelsOrderedAtMark: an abort's mark ordered the cancel of every
	// call it stamped in flight, in the chunk that marked the call's node
	// (every member turns aborting, and no call begins after its node's
	// chunk), so there is no cancel step: the mark's last chunk sets
	// CancelsSent with it (one stored before that, whose cancel step is
	// still to run, has it say so without reading a call). The
	// mark's first chunk sets it for an abort; a chunk that stamps a call
	// it leaves in flight (an exited node keeps its state) clears it. A
	// version that does not know it drops it, and the cancel step reads
	// every call as before.
	CancelsOrderedAtMark bool `json:"cancels_ordered_at_mark,omitempty"`
	// TookOverFrom and SupersededBy name, once each, the terminations this
	// one took nodes over from and the ones that account for nodes of its
	// subtree instead of it (an Indexed termination's TakenOver and
	// HandedOver, by termination): the first MaxNamedTerminations of each
	// (the subtree index and the record name each node's).
	TookOverFrom []string `json:"took_over_from,omitempty"`
	SupersededBy []string `json:"superseded_by,omitempty"`
	// Cursor is how far the chunked step in progress has got (zero: none).
	Cursor Cursor `json:"cursor,omitzero"`
	// Progress last observed (for GetTermination / WatchTermination).
	Progress Progress `json:"progress"`
}

// clone copies t deeply enough that changing the copy, its slices
// included, leaves t alone. TestTerminationCloneIsDeep keeps it complete.
func (t Termination) clone() Termination {
	c := t
	c.Phases = slices.Clone(t.Phases)
	c.Roots = slices.Clone(t.Roots)
	c.RequesterLineage = slices.Clone(t.RequesterLineage)
	c.ProposerLineage = slices.Clone(t.ProposerLineage)
	c.Members = slices.Clone(t.Members)
	c.TakenOver = slices.Clone(t.TakenOver)
	c.HandedOver = slices.Clone(t.HandedOver)
	c.Prior = slices.Clone(t.Prior)
	c.TookOverFrom = slices.Clone(t.TookOverFrom)
	c.SupersededBy = slices.Clone(t.SupersededBy)
	return c
}

// Handoff is a node of the subtree that another termination stops (or
// stopped) as well.
type Handoff struct {
	NodeID string `json:"node_id"`
	// TerminationID is the other termination.
	TerminationID string `json:"termination_id"`
	// State (TakenOver) is the node's state under the other termination
	// when this one took it over: "draining" or "aborting".
	State string `json:"state,omitempty"`
	// RecordID (Prior) is the other termination's record.
	RecordID string `json:"record_id,omitempty"`
}

// Rank is the authority behind a termination, for composing two that
// meet on one node: an operator's (or the security role's) outranks a
// rollout batch's, which outranks an agent's.
type Rank int

const (
	RankAgent Rank = iota + 1
	RankRollout
	RankOperator
)

// Rank is the authority that requested the termination.
func (t Termination) Rank() Rank {
	switch {
	case strings.HasPrefix(t.RequestedBy, "agent:") || len(t.RequesterLineage) > 0:
		return RankAgent
	case t.RolloutID != "":
		return RankRollout
	default:
		return RankOperator
	}
}

// finalReason is the reason the termination gives the grants it revokes
// and the leases it reconciles: the termination's own reason, after the
// principal that requested it. The reason is the requester's free text,
// and an agent may terminate its subtree: unsigned, an agent's reason
// ("operator:admin aborted the subtree") would read as an operator's, or
// as the control plane's own, in the lease's terminal detail and evidence.
// A termination requested without a reason gives the requester alone
// (no dangling ": " that reads as a reason cut off).
func (t Termination) finalReason() string {
	head := "terminated"
	if t.RequestedBy != "" {
		head += " by " + t.RequestedBy
	}
	if t.Reason == "" {
		return head
	}
	return head + ": " + t.Reason
}

// requester is the node of the agent behind an agent's termination: the
// last of its lineage (the requester, or the node that proposed its own
// stop).
func (t Termination) requester() string {
	if n := len(t.RequesterLineage); n > 0 {
		return t.RequesterLineage[n-1]
	}
	return strings.TrimPrefix(t.RequestedBy, "agent:")
}

// proposedBelow reports whether t is an agent's own approved stop
// proposal (ProposerLineage) and node is a strict ancestor of the
// proposing agent.
func (t Termination) proposedBelow(node string) bool {
	n := len(t.ProposerLineage)
	return n > 1 && node != "" && slices.Contains(t.ProposerLineage[:n-1], node)
}

// Aborts reports whether the termination cancels in-flight calls: an
// abort, or a drain escalated past its window.
func (t Termination) Aborts() bool { return t.Mode == ModeAbort || t.Escalated }

// Supersedes decides, when t marks its subtree and finds a node that
// other (unfinished) is stopping, whether t takes the node over. A
// higher authority always does: an operator's termination is never held
// back by an agent's, whatever its windows. Between agents, only the
// agent that requested other, or one of its ancestors, may: a descendant
// agent never takes a node from its ancestor's termination (to give it a
// window of its own). At the same authority an abort takes over anything
// and a drain takes over only a drain (abort supersedes drain; a drain
// never slows an abort down). Otherwise the node stays with other, and
// t's record names other as accounting for it.
//
// One exception to rank: an agent's own stop proposal keeps the agent's
// windows whoever approved it, and an operator's approval does not put it
// beyond the agent's ancestors, nor beyond a rollout's batch. An
// ancestor's stop, or a batch, takes it over as it would the same agent's
// stop approved by the policy (an abort anything, a drain a drain),
// keeping its deadlines (Inherit), so that the proposal shields the agent
// from no one and is loosened by no one (a rollout used to leave out an
// agent draining on its own day-long window an operator approved: rogue34g
// test TestRogue34GOwnApprovedDrainDoesNotKeepTheAgentOutOfARollout).
func Supersedes(t, other Termination) bool {
	if t.Rank() != other.Rank() {
		if t.Rank() < other.Rank() && other.AgentWindows && (t.Rank() == RankRollout || t.Rank() == RankAgent && other.proposedBelow(t.requester())) {
			return t.Mode == ModeAbort || !other.Aborts()
		}
		return t.Rank() > other.Rank()
	}
	if t.Rank() == RankAgent && !slices.Contains(other.RequesterLineage, t.requester()) {
		return false
	}
	return t.Mode == ModeAbort || !other.Aborts()
}

// PolicyTakesOver decides whether t, a stop the proposal policy approved
// on its own (a stop rule's action, or auto-approval: no operator weighed
// it), takes a node over from owner, the unfinished termination stopping
// the node. It takes it over from a stop it outranks (an operator's rule
// over an agent's drain); from one of the same authority it does not (an
// operator's own drain keeps the node on the operator's windows, which a
// rule a rogue can make true would otherwise stretch to the policy's, and
// the proposal waits for an operator) — unless owner's windows are the
// agent's own (AgentWindows: an agent's own stop proposal, whoever
// approved it). Those bind no one, so the policy's stop takes the node
// over whenever it supersedes owner (Supersedes: an operator's rule's
// abort over the agent's drain). Else a rogue that had an operator
// approve its own drain with a day's window held off every abort the
// operator's policy would start on it for that day (rogue34g test
// TestRogue34GOwnApprovedDrainDoesNotHoldOffTheOperatorsRuleAbort).
//
// An agent's rule outranks nothing, but its setter is an authority over
// its descendants' own stops: its stop takes a node over from the stop a
// descendant of the setter requested as the setter's own would
// (Supersedes: the setter is in its lineage; an abort anything, a drain a
// drain), bound at the node by that stop's deadline (InheritAtRoot), so
// never given the rule's window afresh. Else a rogue below the setter held
// off the setter's rule by draining the node first with a day's window:
// the rule's abort waited, pending, for an operator while the node's calls
// ran on the rogue's day (rogue42c test
// TestRogue42CDescendantsDrainDoesNotHoldOffItsAncestorsRuleAbort).
func PolicyTakesOver(t, owner Termination) bool {
	if owner.AgentWindows {
		return Supersedes(t, owner)
	}
	if t.Rank() == RankAgent && owner.Rank() == RankAgent && t.requester() != owner.requester() {
		return Supersedes(t, owner)
	}
	return t.Rank() > owner.Rank()
}

// Inherit is what t keeps of owner's deadlines when it takes nodes over
// from it. The same authority (two operators' stops, two batches of
// rollouts, or one agent's own two stops) never loosens the bound it set:
// a repeated stop request (a client's retry) or a stop of a subtree inside
// one being stopped takes the nodes over, but its drain and
// acknowledgement deadlines are no later than the ones owner already set —
// else a rogue's call in flight, or its gate's late acknowledgement, would
// win a fresh window from each repeat. A higher authority's stop (an
// operator's over an agent's) keeps its own windows: an agent cannot
// shorten an operator's drain of the rest of the tree by draining a child
// of its own with no window first. Nor does an agent's own approved stop
// proposal bind anyone: its windows are the proposing agent's choice,
// whoever approved it (a stop rule's are its setter's, and bind) — except
// the same agent's own later proposals: a decoy proposal with a day's window,
// approved after the first, does not loosen the agent's own bound.
//
// An ancestor's stop that takes over the agent's own proposal an operator
// approved (Supersedes) is bound by it too, by its deadlines and by its
// acknowledgement and confirm windows: the stop a higher authority
// approved is made harder, never longer, by a lower one.
func Inherit(t, owner Termination) Termination {
	below := t.Rank() < owner.Rank()
	if !below && (t.Rank() != owner.Rank() || t.Rank() == RankAgent && t.requester() != owner.requester() || owner.AgentWindows && !(t.AgentWindows && t.NodeID == owner.NodeID)) {
		return t
	}
	if below {
		// The waits the approved stop has not begun yet have no deadline
		// to keep: its windows bound them.
		t.CancelAckTimeout = min(t.CancelAckTimeout, owner.CancelAckTimeout)
		t.ConfirmTimeout = min(t.ConfirmTimeout, owner.ConfirmTimeout)
	}
	return keepDeadline(t, owner)
}

// InheritAtRoot is what t keeps of owner's deadlines when it takes its
// own root over from owner: what Inherit keeps and, for a stop the policy
// started on its own (a stop rule's action, auto-approval: no one weighed
// its timing, and a rule's condition may be the workload's to make true),
// the deadline owner is waiting on whatever owner's authority. Its root's
// whole subtree was owner's to stop by then, so owner's deadline holds
// nothing of anyone outside owner's reach; else a worker its parent
// drained with a second's window earned the policy's window afresh (half
// a minute by default) by reporting a counter that made an operator's
// drain rule true (rogue42c test
// TestRogue42CMakingAnOperatorsDrainRuleTrueWinsTheWorkerNoTime), the
// stretch the policy already refuses over an operator's own stop
// (PolicyTakesOver). Below its root a policy's stop keeps Inherit's rule:
// a descendant's stop binds no higher authority's stop of the rest.
func InheritAtRoot(t, owner Termination) Termination {
	t = Inherit(t, owner)
	if !strings.HasPrefix(t.RequestedBy, PolicyDecider) {
		return t
	}
	return keepDeadline(t, owner)
}

// keepDeadline keeps the deadline owner is waiting on in its phase.
func keepDeadline(t, owner Termination) Termination {
	// Only the bound owner is waiting on binds: a drain deadline once the
	// drain is over (no call of owner's is left in flight) would turn t's
	// drain of nodes that never had a bound into an abort.
	switch owner.Phase {
	case PhaseDraining:
		t.KeptDrainDeadline = earliest(t.KeptDrainDeadline, owner.DrainDeadline)
	case PhaseAborting:
		t.KeptCancelDeadline = earliest(t.KeptCancelDeadline, owner.CancelDeadline)
	case PhaseReconciling:
		t.KeptConfirmDeadline = earliest(t.KeptConfirmDeadline, owner.ConfirmDeadline)
		t.KeptHookDeadline = earliest(t.KeptHookDeadline, owner.HookDeadline)
	}
	return t
}

// HookDeadlineFrom is the hook deadline of a revocation starting at now:
// its hook timeout on, or the one kept from a stop it took over, if
// earlier (zero: no wait).
func (t Termination) HookDeadlineFrom(now time.Time) time.Time {
	if t.HookTimeout <= 0 {
		return time.Time{}
	}
	return earliest(now.Add(t.HookTimeout), t.KeptHookDeadline)
}

// earliest is the earliest of the non-zero times (zero: none).
func earliest(ts ...time.Time) time.Time {
	var out time.Time
	for _, x := range ts {
		if !x.IsZero() && (out.IsZero() || x.Before(out)) {
			out = x
		}
	}
	return out
}

// Reach is what a termination marking its subtree does with one node.
type Reach int

const (
	// ReachMark: the node is running; the termination marks it.
	ReachMark Reach = iota + 1
	// ReachTakeOver: another termination is stopping the node and this
	// one supersedes it; the node, and its open calls, become this one's.
	ReachTakeOver
	// ReachLeave: another termination is stopping the node and is not
	// superseded; it accounts for the node (listed in HandedOver).
	ReachLeave
	// ReachPrior: an earlier termination has terminated the node (listed
	// in Prior with that termination's record).
	ReachPrior
)

// ReachNode decides Reach for a node in state with owner (the
// termination the node names, if it is stopping or stopped).
func ReachNode(t Termination, state tree.NodeState, owner Termination) Reach {
	switch {
	case state == tree.NodeStateRunning:
		return ReachMark
	case state != tree.NodeStateTerminated && owner.ID == "":
		// Stopped outside any termination (an exit confirmed on its own):
		// this termination still covers it.
		return ReachMark
	case state == tree.NodeStateTerminated || owner.Phase == PhaseTerminated:
		return ReachPrior
	case Supersedes(t, owner):
		return ReachTakeOver
	default:
		return ReachLeave
	}
}

// MarkedState is the state a node gets when t marks or takes it over:
// aborting for an abort, draining for a drain, and never back from
// aborting to draining.
func MarkedState(t Termination, current tree.NodeState) tree.NodeState {
	if t.Mode == ModeAbort || t.Escalated || current == tree.NodeStateAborting {
		return tree.NodeStateAborting
	}
	return tree.NodeStateDraining
}

// Superseded reports whether every node the termination marked has been
// taken over by others: nothing is left for it to stop, and it finishes
// with a record that names them.
func (t Termination) Superseded() bool {
	return t.MemberCount() == 0 && t.HandedOverCount() > 0 && t.Phase != PhaseRequested && t.Phase != PhaseTerminated
}

// MemberCount is how many nodes the termination stops (Members).
func (t Termination) MemberCount() int {
	if t.Indexed {
		return t.Counts.Members
	}
	return len(t.Members)
}

// HandedOverCount is how many nodes of the subtree other terminations
// account for (HandedOver).
func (t Termination) HandedOverCount() int {
	if t.Indexed {
		return t.Counts.HandedOver
	}
	return len(t.HandedOver)
}

// TookOverFromIDs names, once each, the terminations t took nodes over
// from (the first MaxNamedTerminations).
func (t Termination) TookOverFromIDs() []string {
	if t.Indexed {
		return t.TookOverFrom
	}
	return handoffTerminations(t.TakenOver)
}

// SupersededByIDs names, once each, the terminations that account for
// nodes of t's subtree instead of t (the first MaxNamedTerminations).
func (t Termination) SupersededByIDs() []string {
	if t.Indexed {
		return t.SupersededBy
	}
	return handoffTerminations(t.HandedOver)
}

func handoffTerminations(hs []Handoff) []string {
	var out []string
	for _, h := range hs {
		out = noteNamed(out, h.TerminationID)
	}
	return out
}

// HandOver removes the nodes another termination (to) has taken over from
// the members and notes them in HandedOver.
func HandOver(t Termination, nodes map[string]bool, to string, now time.Time) Termination {
	if t.Indexed {
		// The index keeps its entries: a member whose node now names
		// another termination is that one's (chunks.go).
		removed := min(len(nodes), t.Counts.Members)
		t.Counts.Members -= removed
		t.MembersIntact = false
		t.Counts.HandedOver += removed
		t.SupersededBy = noteNamed(t.SupersededBy, to)
		t.Progress.Unconfirmed = max(0, t.Progress.Unconfirmed-removed)
		t.UpdatedAt = now
		return t
	}
	members := make([]string, 0, len(t.Members))
	for _, m := range t.Members {
		if nodes[m] {
			t.HandedOver = append(t.HandedOver, Handoff{NodeID: m, TerminationID: to})
			continue
		}
		members = append(members, m)
	}
	removed := len(t.Members) - len(members)
	t.Members = members
	t.Progress.Unconfirmed = max(0, t.Progress.Unconfirmed-removed)
	t.UpdatedAt = now
	return t
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
	if t.Cursor.Step != ActWait && t.Phase != PhaseTerminated {
		// A chunked step in progress is finished before anything else.
		return t.Cursor.Step, time.Time{}
	}
	if t.Superseded() {
		return ActWriteRecord, time.Time{}
	}
	switch t.Phase {
	case PhaseRequested:
		return ActMark, time.Time{}
	case PhaseDraining:
		// A drain waits, up to its window, for every call it accounts
		// for: those in flight and those with a cancel order (a node it
		// took over aborting keeps aborting, and its calls their orders,
		// moved with the node or written by the mark). Until the
		// forty-fifth pass only a call with no order held it open: a rogue
		// that aborted its own child first had its operator's drain end
		// at once, its calls closed cancel_unacknowledged and the gate's
		// word a second later refused (rogue45d test
		// TestRogue45DAnOwnAbortDoesNotStripTheOperatorsDrainOfItsWait).
		if p.CallsInFlight == 0 && p.CancelsPending == 0 {
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
		// The record waits for the exit confirmations and the privilege
		// revocations, each up to its own deadline on this clock.
		confirmsDone := p.Unconfirmed == 0 || !now.Before(t.ConfirmDeadline)
		hooksDone := p.HooksPending == 0 || !now.Before(t.HookDeadline)
		switch {
		case confirmsDone && hooksDone:
			return ActWriteRecord, time.Time{}
		case confirmsDone:
			return ActWait, t.HookDeadline
		case hooksDone:
			return ActWait, t.ConfirmDeadline
		}
		return ActWait, minTime(t.ConfirmDeadline, t.HookDeadline)
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
	if action != ActWait {
		t.Cursor = Cursor{} // the step is done
	}
	switch {
	case action == ActMark && t.Phase == PhaseRequested:
		if t.Mode == ModeAbort {
			t = enter(t, PhaseAborting, now)
			t.CancelDeadline = earliest(now.Add(t.CancelAckTimeout), t.KeptCancelDeadline)
			// A mark that ordered every cancel there is to order has sent
			// them: the cancel step would only say so, in a transaction
			// of its own. (No call comes to this termination after its
			// mark: only a mark's chunk takes nodes and calls over.)
			t.CancelsSent = t.CancelsOrderedAtMark
		} else {
			t = enter(t, PhaseDraining, now)
			t.DrainDeadline = earliest(now.Add(t.DrainWindow), t.KeptDrainDeadline)
		}
	case action == ActEndDrain && t.Phase == PhaseDraining:
		t = enter(t, PhaseReconciling, now)
	case action == ActEscalate && t.Phase == PhaseDraining:
		// The shell sent the cancel orders with the escalation.
		t.Escalated = true
		t = enter(t, PhaseAborting, now)
		t.CancelDeadline = earliest(now.Add(t.CancelAckTimeout), t.KeptCancelDeadline)
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
		t.ConfirmDeadline = earliest(now.Add(t.ConfirmTimeout), t.KeptConfirmDeadline)
		if t.HookDeadline.IsZero() {
			// (A chunked revocation sets it when it starts its first chunk.)
			t.HookDeadline = t.HookDeadlineFrom(now)
		}
	case action == ActWriteRecord && (t.Phase == PhaseReconciling && t.Revoked || t.Superseded()):
		t = enter(t, PhaseTerminated, now)
	case action == ActWait:
	default:
		return t, fmt.Errorf("supervisor: action %s is not allowed in phase %s", action, t.Phase)
	}
	return t, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
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
		return Termination{}, fmt.Errorf("%w: mode must be drain or abort", tree.ErrInvalidArgument)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"drain_window", drain}, {"cancel_ack_timeout", cancelAck}, {"confirm_timeout", confirm}} {
		if d.v < 0 || d.v > MaxTerminationWindow {
			return Termination{}, fmt.Errorf("%w: %s must be between 0 and %s", tree.ErrInvalidArgument, d.name, MaxTerminationWindow)
		}
	}
	if len(reason) > MaxReasonBytes {
		return Termination{}, fmt.Errorf("%w: reason is longer than %d bytes", tree.ErrInvalidArgument, MaxReasonBytes)
	}
	t := Termination{
		ID: id, NodeID: nodeID, Mode: mode, DrainWindow: drain, CancelAckTimeout: cancelAck,
		ConfirmTimeout: confirm, Reason: reason, RequestedBy: requestedBy, RequestedAt: now, UpdatedAt: now,
		Indexed: true,
	}
	return enter(t, PhaseRequested, now), nil
}

// StoppedWaitingAt is the instant the termination stopped waiting for word
// of its calls: when it entered reconciling (every call had ended or been
// acknowledged, or the acknowledgement deadline had come). Zero before
// that. A call still open then is closed cancel_unacknowledged as of this
// instant, whenever the record that closes it comes to be written (the
// confirmations and revoke hooks it waits for may take minutes; a restart
// longer): the gate's silence is dated where the termination stopped
// listening.
func (t Termination) StoppedWaitingAt() time.Time {
	for _, p := range t.Phases {
		if p.Phase == PhaseReconciling {
			return p.StartedAt
		}
	}
	return time.Time{}
}

// UnderStopSince is the instant from which a holder's word about its job
// is its claim under this stop (markClaimsUnderStop): the earlier of the
// request (RequestedAt, on the clock of the replica that took it) and the
// mark (the start of the phase after requested, on the reconciler's, the
// leader's, as the lease machine's judgements are). On etcd the two are
// two replicas' clocks, and the request's is the requester's choice: an
// agent stopping its own subtree asked it of a replica whose clock ran
// ahead of the leader's, and its child's report after the mark, judged on
// the leader's clock before the request's time, read as given before the
// stop (thirtieth pass). What is left is a report judged between the
// request and the mark on a leader whose clock runs behind.
func (t Termination) UnderStopSince() time.Time {
	at := t.RequestedAt
	for _, p := range t.Phases {
		if p.Phase != PhaseRequested {
			if !p.StartedAt.IsZero() && p.StartedAt.Before(at) {
				at = p.StartedAt
			}
			break
		}
	}
	return at
}

// StopSinceAt is the instant a node came under a stop once t marks it or,
// takingOver, takes it over from owner: the earliest of what the node kept
// (since, tree.Node.StopSince), t's request, now (the mark, when the
// reconciler's clock reads it earlier: UnderStopSince) and, for a node
// taken over, owner's UnderStopSince (for a node marked before it was
// kept). Every stop that takes the node over keeps it, so a holder's word
// given under the first stop is its claim under stop in the record of the
// one that accounts for the node (markClaimsUnderStop): until the
// forty-fourth pass that record judged it against its own request alone,
// and a rogue's SUCCESS given while an operator drained it read as a
// result of before any stop once the operator's abort (or a client's
// retry of the drain) took the node over (rogue44e test
// TestRogue44EAClaimUnderAStopTakenOverStaysAClaim).
func (t Termination) StopSinceAt(since time.Time, owner Termination, takingOver bool, now time.Time) time.Time {
	at := earliest(since, t.RequestedAt, now)
	if takingOver {
		at = earliest(at, owner.UnderStopSince())
	}
	return at
}

// MaxReasonBytes bounds a termination's reason (and a stop proposal's).
const MaxReasonBytes = 1024

// MaxTerminationWindow bounds each of a termination's windows.
const MaxTerminationWindow = 24 * time.Hour

// MaxNamedTerminations bounds the other terminations a termination names
// in TookOverFrom and in SupersededBy (and GetTermination answers with):
// the first that many, each once. The subtree index keeps, node by node,
// the termination each node was taken over from or left to, and the
// record names it (inner_termination_id, superseded_by_termination_id).
// Unbounded, the lists grew with the stops a rogue made of its own
// subtree's nodes, which nothing bounds, each one in the stored value
// every chunk rewrites, and searched per node the mark lists: about 40,000
// of them passed the store's largest value, and the operator's stop that
// took them over could no longer write its mark (rogue39j test
// TestRogue39JManyOwnStopsDoNotGrowTheOperatorsTermination).
const MaxNamedTerminations = 64

// noteNamed adds id to ids once, while they name fewer than
// MaxNamedTerminations.
func noteNamed(ids []string, id string) []string {
	if len(ids) >= MaxNamedTerminations || slices.Contains(ids, id) {
		return ids
	}
	return append(ids, id)
}
