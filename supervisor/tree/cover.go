package tree

import (
	"errors"
	"fmt"

	"github.com/tetherhq/tether/internal/store"
)

// Stops that cover a node before they reach it.
//
// A termination is requested in one transaction and marks its subtree in
// later ones, top down: the roots first, then their descendants chunk by
// chunk. Between the request and the mark's arrival at a node the node
// still reads running, yet the termination already covers it, and what a
// node being stopped may not do (begin a tool call, spawn, take new work,
// start a stop of its own, vouch for a descendant as an independent
// witness) a covered node may not do either. Two facts say a running
// node is covered: an ancestor that is stopping or stopped
// (StoppingAncestorIn), or a termination requested on the node or an
// ancestor and not yet marked there (the stop-request key, written with the
// request and removed by the mark's first chunk, which marks the roots).

// CoverRequested is a Cover's State when the stop is requested and its
// mark has not reached the node it is on.
const CoverRequested = "requested"

// Cover is the stop covering a running node: the node it is on (the
// covered node itself, or an ancestor), that node's state under it
// ("draining", "aborting", "terminated", or CoverRequested), and the
// termination.
type Cover struct {
	NodeID        string
	State         string
	TerminationID string
}

// Describe says, for the covered node nodeID, what covers it, in the
// words of a refusal: "node n is below a, which is draining (termination
// t)", "node n is below a, whose termination t is requested", or "node
// n's termination t is requested".
func (c *Cover) Describe(nodeID string) string {
	switch {
	case c.State == CoverRequested && c.NodeID == nodeID:
		return fmt.Sprintf("node %s's termination %s is requested", nodeID, c.TerminationID)
	case c.State == CoverRequested:
		return fmt.Sprintf("node %s is below %s, whose termination %s is requested", nodeID, c.NodeID, c.TerminationID)
	}
	return fmt.Sprintf("node %s is below %s, which is %s (termination %s)", nodeID, c.NodeID, c.State, c.TerminationID)
}

// LineageStop is one node of a lineage as CoverOf weighs it: its state,
// the termination it names (TerminationID, "" none) and the termination
// requested on it and not yet marked there (Requested, "" none).
type LineageStop struct {
	NodeID        string
	State         NodeState
	TerminationID string
	Requested     string
}

// CoverOf decides which stop covers the last node of lineage (its
// ancestors root first, then the node itself, which is running): the
// nearest ancestor that is stopping or stopped (StopsBelow: an exited one
// only once a termination has marked it), else the nearest node of the
// lineage, the node itself included, with a stop requested on it. It
// returns that node's index and whether it is the request that covers
// (at < 0: nothing covers the node). An exited ancestor outside every
// termination stops nothing below it (children may outlive what created
// them), but a stop requested on one covers its subtree: the mark walks
// it. CoveringStopIn decides the same from the store.
func CoverOf(lineage []LineageStop) (at int, requested bool) {
	for i := len(lineage) - 2; i >= 0; i-- {
		if StopsBelow(lineage[i].State, lineage[i].TerminationID) {
			return i, false
		}
	}
	for i := len(lineage) - 1; i >= 0; i-- {
		if lineage[i].Requested != "" {
			return i, true
		}
	}
	return -1, false
}

// CoveringStopIn returns, read in tx, the stop covering n, a running node
// (CoverOf), or nil when none does.
func CoveringStopIn(tx store.ReadTxn, n *Node) (*Cover, error) {
	lineage := append(append([]string(nil), n.Ancestors...), n.NodeID)
	// The ancestors' nodes and the lineage's requests, in one round trip
	// on etcd.
	if err := store.Prefetch(tx, append(store.KeysOf(n.Ancestors, nodeKey), store.KeysOf(lineage, stopRequestedKey)...), nil); err != nil {
		return nil, err
	}
	above, err := StoppingAncestorIn(tx, n)
	if err != nil {
		return nil, err
	}
	if above != nil {
		return &Cover{NodeID: above.NodeID, State: StateName(above.State), TerminationID: above.TerminationID}, nil
	}
	stops := make([]LineageStop, len(lineage))
	for i, id := range lineage {
		stops[i] = LineageStop{NodeID: id, State: NodeStateRunning}
		v, err := tx.Get(stopRequestedKey(id))
		switch {
		case err == nil:
			stops[i].Requested = string(v)
		case !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
	}
	at, _ := CoverOf(stops)
	if at < 0 {
		return nil, nil
	}
	return &Cover{NodeID: stops[at].NodeID, State: CoverRequested, TerminationID: stops[at].Requested}, nil
}

// CoverKeys are the keys CoveringStopIn reads for node nodeID with
// ancestors, for a caller to prefetch with its own reads.
func CoverKeys(nodeID string, ancestors []string) [][]byte {
	keys := store.KeysOf(ancestors, nodeKey)
	for _, id := range ancestors {
		keys = append(keys, stopRequestedKey(id))
	}
	return append(keys, stopRequestedKey(nodeID))
}

// StopRequestsIn calls fn, read in tx, with each node a termination is
// requested on and not yet marked there, and that termination: with the
// nodes' states (StopsBelow), what CoverOf weighs, for a caller that reads
// the whole tree at once (a rollout judging its replacements) instead of
// one lineage (CoveringStopIn).
func StopRequestsIn(tx store.ReadTxn, fn func(nodeID, terminationID string)) error {
	return tx.Scan([]byte(prefixStopRequested), nil, func(k, v []byte) error {
		fn(string(k[len(prefixStopRequested):]), string(v))
		return nil
	})
}

// NoteStopRequestedIn notes, in the transaction that requests it, that
// termination terminationID is requested on nodeID: until its mark's
// first chunk marks the node (ClearStopRequestedIn), the node and its
// subtree are covered (CoveringStopIn). A later request on the node
// replaces the note; the node is covered either way.
func NoteStopRequestedIn(tx store.Txn, nodeID, terminationID string) error {
	return tx.Put(stopRequestedKey(nodeID), []byte(terminationID))
}

// ClearStopRequestedIn removes the note that terminationID is requested on
// nodeID, in the transaction of the mark's chunk that marks the node (a
// note of another, later request is left for that one's mark).
func ClearStopRequestedIn(tx store.Txn, nodeID, terminationID string) error {
	v, err := tx.Get(stopRequestedKey(nodeID))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case string(v) != terminationID:
		return nil
	}
	return tx.Delete(stopRequestedKey(nodeID))
}
