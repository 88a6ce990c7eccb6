package tree

import "fmt"

// Decisions an agent may take about work it does not hold itself: the job
// leases its lineage coordinates (offered, reassigned, asked to cancel,
// resolved, or claimed: a worker message about a job it does not hold,
// which on the job's active generation is an ownership conflict that
// halts the holder's work as a cancel would).
const (
	DecideOffer         = "offer"
	DecideReassign      = "reassign"
	DecideRequestCancel = "request_cancel"
	DecideResolve       = "resolve"
	DecideClaim         = "claim"
)

// decisionWords names a decision in a refusal, in the caller's words.
var decisionWords = map[string]string{
	DecideOffer:         "offer a job",
	DecideReassign:      "reassign a job",
	DecideRequestCancel: "ask for a job's cancel",
	DecideResolve:       "resolve a job",
	DecideClaim:         "claim a job it does not hold",
}

// DecisionWords names decision in a refusal, in the caller's words.
func DecisionWords(decision string) string {
	if what, ok := decisionWords[decision]; ok {
		return what
	}
	return decision
}

// MayDecide says whether an agent whose node is n may take decision about
// work it does not hold. Only a running agent decides: one that is being
// stopped (draining or aborting), stopped or exited is the workload a
// termination accounts for — its least reliable narrator (design §8) —
// and its word that a job it coordinates ended (resolved FAILED, CANCELLED
// or UNRESOLVED) would be the stopped agent writing its own record, read
// there like a job its lineage closed before the stop. What it holds
// itself it still finishes (a holder's Complete and CancelAck are the
// holder's own report, and draining lets work in flight end); the
// termination reconciles the rest, and an operator or the lineage above
// the stop decides the jobs. It is pure: the caller reads the node.
func MayDecide(n *Node, decision string) error {
	if n.State == NodeStateRunning {
		return nil
	}
	what, ok := decisionWords[decision]
	if !ok {
		what = decision
	}
	return fmt.Errorf("%w: agent %s is %s: an agent being stopped, stopped or exited cannot %s; an operator or the lineage above the stop decides it, and the termination reconciles the jobs the node's subtree holds",
		ErrNodeStopping, n.NodeID, StateName(n.State), what)
}

// MayDecideUnder is MayDecide for a node read with GetUnder: a running
// node a stop covers (cover, nil when none does: requested on it or an
// ancestor, or marked down to an ancestor) is the workload of that
// termination, whose mark has not reached it yet, and decides nothing
// either.
func MayDecideUnder(n *Node, cover *Cover, decision string) error {
	if n.State != NodeStateRunning || cover == nil {
		return MayDecide(n, decision)
	}
	what, ok := decisionWords[decision]
	if !ok {
		what = decision
	}
	return fmt.Errorf("%w: %s: an agent being stopped, stopped or exited cannot %s; an operator or the lineage above the stop decides it, and the termination reconciles the jobs the node's subtree holds",
		ErrNodeStopping, cover.Describe(n.NodeID), what)
}
