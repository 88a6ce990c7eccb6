package tree

import (
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// Node is one agent in the tree. Its stored form is the protobuf encoding
// of tether.v1.Node (the pb tags are that message's field numbers), so a
// node written by any version reads back.
type Node struct {
	NodeID       string `pb:"1"`
	ParentNodeID string `pb:"2"`
	// Ancestors, root first, excluding the node itself.
	Ancestors []string          `pb:"3"`
	Name      string            `pb:"4"`
	Labels    map[string]string `pb:"5"`
	State     NodeState         `pb:"6"`
	CreatedAt time.Time         `pb:"7"`
	// Who registered or spawned the node (principal id).
	CreatedBy  string    `pb:"8"`
	LastSeenAt time.Time `pb:"9"`
	// The first confirmation of its exit (zero: none), and the strongest
	// confirming party.
	ExitedAt        time.Time `pb:"10"`
	ExitConfirmedBy string    `pb:"11"`
	// The termination that stopped (or is stopping) this node, if any.
	TerminationID string `pb:"12"`
	// When the agent (or its launcher) reported it ready to take work.
	ReadyAt time.Time `pb:"13"`
	// Every party that confirmed the exit (first word of each, bounded).
	ExitConfirmations []ExitConfirmation `pb:"14"`
	// Activity after ExitedAt (bounded: the first few are kept).
	Contradictions []Contradiction `pb:"15"`
	// The control plane's own observation of the agent's session: when one
	// was last opened and last closed.
	SessionOpenedAt time.Time `pb:"16"`
	SessionClosedAt time.Time `pb:"17"`
	// The node's sessions open now, as the control plane sees them
	// (bounded).
	OpenSessions []OpenSession `pb:"18"`
	// What the node may hold (Holdings): noted by the writers that give
	// it a grant, a privilege, a tool call or a child, in the transaction
	// that does, so that a termination reads them only of the nodes that
	// may have some.
	Holds Holdings `pb:"19"`
	// The order of the control plane's observations of the node's life:
	// the heartbeat written as LastSeenAt and the session end written as
	// SessionClosedAt each take the next number past both, in the
	// transaction that writes them (SeenAfterSessionEnd). The times are
	// the clocks of the replicas that saw each, which may differ; these
	// are the store's order. Zero: written before they were kept.
	LastSeenSeq      uint64 `pb:"20"`
	SessionClosedSeq uint64 `pb:"21"`
	// A descendant that never had a session, its credential served after
	// this node's exit was confirmed (NoteAtWorkAfterClaims): the first
	// one seen (bounded to one). Stored only, not on the wire.
	BelowAfterClaim []BelowAfterClaim `pb:"22"`
	// StopSince is the instant the node first came under a stop: the
	// request of the first termination whose mark reached it (or that
	// mark, if the control plane's clock read it earlier). Every stop
	// that takes the node over keeps it, so a holder's word about its job
	// given under the first is its claim under stop in the record of the
	// last (the supervisor's markClaimsUnderStop). Zero: never marked, or
	// marked before it was kept. Stored only, not on the wire.
	StopSince time.Time `pb:"23"`
}

// BelowAfterClaim is a descendant of a node whose credential the control
// plane served after the node's exit was confirmed, read as stored when
// the descendant's request came: so in the store's order, not by two
// nodes' times.
type BelowAfterClaim struct {
	NodeID       string    `pb:"1"`
	ParentNodeID string    `pb:"2"`
	Kind         string    `pb:"3"` // one of the Activity kinds
	At           time.Time `pb:"4"`
}

// nextSeenSeq is the number the next observation of n's life takes.
func nextSeenSeq(n *Node) uint64 { return max(n.LastSeenSeq, n.SessionClosedSeq) + 1 }

// SeenAfterSessionEnd reports whether the control plane saw n alive (a
// heartbeat written as its last seen) after the last end of its session
// it saw. The order is the store's (LastSeenSeq, SessionClosedSeq), not
// the wall clocks of the replicas that wrote the two times: a rogue that
// ends its session on a replica whose clock runs ahead and heartbeats on
// one whose clock runs behind is seen alive after its end all the same.
// A node whose two observations were both written before the order was
// kept is weighed by their times.
func SeenAfterSessionEnd(n *Node) bool {
	if n.SessionClosedAt.IsZero() || n.LastSeenAt.IsZero() {
		return false
	}
	if n.LastSeenSeq == 0 && n.SessionClosedSeq == 0 {
		return n.LastSeenAt.After(n.SessionClosedAt)
	}
	return n.LastSeenSeq > n.SessionClosedSeq
}

// SessionEndIsLastSeen reports whether the last the control plane saw of
// n is its session's end: a heartbeat now must be written whatever the
// times say (a replica's clock behind the one that wrote last seen would
// throttle it away), or the end would read as the node's last word.
func SessionEndIsLastSeen(n *Node) bool {
	return !n.SessionClosedAt.IsZero() && !SeenAfterSessionEnd(n)
}

// NoteSeenAfterSessionEnd records, on n, that the control plane saw the
// node alive now (its credential at work: a tool call begun or refused
// with its token) when the last it saw of n was its session's end, and
// reports whether n changed (the caller writes it, in the transaction
// that read it). Otherwise it changes nothing: only the first such sign
// of life after an end is written, so a node that calls tools with its
// session open costs no write. A bare claim of exit is then weighed as
// one with a heartbeat after the end (SeenAfterSessionEnd).
func NoteSeenAfterSessionEnd(n *Node, now time.Time) bool {
	if !SessionEndIsLastSeen(n) {
		return false
	}
	n.LastSeenAt, n.LastSeenSeq = now, nextSeenSeq(n)
	return true
}

// Holdings says which kinds of holdings a node may have. A node created
// with HoldsTracked has a bit set for each kind from the first one it is
// given (the bit is never cleared: it means "may hold", not "holds"); a
// node without HoldsTracked was created before the bits were kept, and may
// hold anything.
type Holdings uint32

// Kinds of holdings.
const (
	HoldsTracked    Holdings = 1 << iota // the other bits are kept
	HoldsGrants                          // a grant (grants/holder/<node>/)
	HoldsPrivileges                      // a privilege (privileges/node/<node>/)
	HoldsCalls                           // a tool call (calls/open/<node>/)
	HoldsChildren                        // a child (agents/child/<node>/)
	// HoldsRefusalCount: a termination counted refused calls of the node
	// past those its record lists (calls/refusedmore/<termination>/<node>).
	HoldsRefusalCount
	// HoldsEndedCalls: a call of the node ended on a termination's
	// account and may be in no record yet (calls/endedon/<node>/):
	// noted where a call is put on a termination's account while open
	// (the mark that stamps it, the ledger when it ends under a requested
	// stop), so a mark reads the list only of the nodes that may have one.
	HoldsEndedCalls
)

// May reports whether a node with these holdings may hold one of kind.
func (h Holdings) May(kind Holdings) bool { return h&HoldsTracked == 0 || h&kind != 0 }

// With is h noting kind (h itself if h does not keep the bits: such a node
// may hold anything).
func (h Holdings) With(kind Holdings) Holdings {
	if h&HoldsTracked == 0 {
		return h
	}
	return h | kind
}

// NodeState is where a node is in its life; the values are tether.v1's.
type NodeState int32

// Node states.
const (
	NodeStateUnspecified NodeState = 0
	NodeStateRunning     NodeState = 1
	NodeStateDraining    NodeState = 2
	NodeStateAborting    NodeState = 3
	NodeStateTerminated  NodeState = 4
	// Its exit was confirmed outside a termination: it can no longer
	// spawn, begin tool calls, take leases, open a session or refresh
	// credentials. A later termination covering it accounts for it.
	NodeStateExited NodeState = 5
)

var nodeStateNames = [...]string{
	NodeStateUnspecified: "NODE_STATE_UNSPECIFIED",
	NodeStateRunning:     "NODE_STATE_RUNNING",
	NodeStateDraining:    "NODE_STATE_DRAINING",
	NodeStateAborting:    "NODE_STATE_ABORTING",
	NodeStateTerminated:  "NODE_STATE_TERMINATED",
	NodeStateExited:      "NODE_STATE_EXITED",
}

// String is the state's tether.v1 name ("NODE_STATE_RUNNING"), or its
// number when it has none.
func (s NodeState) String() string { return enumname.Of(nodeStateNames[:], s, "") }

// ExitConfirmation is one party's word that a node's process exited.
type ExitConfirmation struct {
	// The principal id, e.g. "agent:<node_id>" or "operator:launcher".
	By string `pb:"1"`
	// ConfirmedBySelf, ConfirmedByAncestor or ConfirmedByLauncher.
	Kind   string    `pb:"2"`
	At     time.Time `pb:"3"`
	Reason string    `pb:"4"`
}

// Contradiction is activity from a node after its exit was confirmed: the
// control plane refused it and kept it as evidence.
type Contradiction struct {
	Kind   string    `pb:"1"` // one of the Activity kinds
	At     time.Time `pb:"2"`
	Detail string    `pb:"3"`
}

// OpenSession is one open session of a node.
type OpenSession struct {
	SessionID string    `pb:"1"`
	OpenedAt  time.Time `pb:"2"`
	// The control-plane process serving it.
	Instance string `pb:"3"`
}

// SessionSignal tells an open session to drain or abort (Signals).
type SessionSignal struct {
	Kind          SignalKind
	TerminationID string
	Deadline      time.Time // zero: none
	Reason        string
}

// SignalKind is what a session is told to do; the values are tether.v1's.
type SignalKind int32

// Signal kinds.
const (
	SignalKindUnspecified SignalKind = 0
	SignalKindDrain       SignalKind = 1
	SignalKindAbort       SignalKind = 2
)

var signalKindNames = [...]string{
	SignalKindUnspecified: "SIGNAL_KIND_UNSPECIFIED",
	SignalKindDrain:       "SIGNAL_KIND_DRAIN",
	SignalKindAbort:       "SIGNAL_KIND_ABORT",
}

// String is the kind's tether.v1 name ("SIGNAL_KIND_DRAIN"), or its number
// when it has none.
func (k SignalKind) String() string { return enumname.Of(signalKindNames[:], k, "") }
