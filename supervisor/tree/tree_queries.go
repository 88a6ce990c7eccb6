package tree

import (
	"errors"

	"github.com/tetherhq/tether/internal/store"
)

// The tree queries other layers read inside their own transactions.
// controlplane adapts them to grantstore.Tree, the capability layer's view
// of the agent tree: grantstore never imports the supervisor.

// GetNodeIn returns a node inside a transaction (see the function GetNodeIn).
func (t *Tree) GetNodeIn(tx store.ReadTxn, nodeID string) (*Node, error) {
	return GetNodeIn(tx, nodeID)
}

// SubtreeIn returns rootID's node and its descendants inside a transaction.
func (t *Tree) SubtreeIn(tx store.ReadTxn, rootID string) ([]*Node, error) {
	return SubtreeIn(tx, rootID)
}

// NodeNotFound reports whether err wraps ErrNodeNotFound.
func (t *Tree) NodeNotFound(err error) bool { return errors.Is(err, ErrNodeNotFound) }

// NodeKeys names the store keys of the nodes, for a caller that fetches
// them with its own reads (a revocation, with its grants).
func (t *Tree) NodeKeys(nodeIDs []string) [][]byte { return store.KeysOf(nodeIDs, nodeKey) }

// PrefetchNodesIn fetches the nodes together ahead of GetNodeIn
// (store.Prefetch): on etcd one request for many, not a round trip each.
func (t *Tree) PrefetchNodesIn(tx store.ReadTxn, nodeIDs []string) error {
	return store.Prefetch(tx, t.NodeKeys(nodeIDs), nil)
}
