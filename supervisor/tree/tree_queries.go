package tree

import (
	"errors"

	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The tree queries other layers read inside their own transactions. They
// make *Tree satisfy grantstore.Tree, the capability layer's view of the
// agent tree, which controlplane wires in: grantstore never imports the
// supervisor.

// GetNodeIn returns a node inside a transaction (see the function GetNodeIn).
func (t *Tree) GetNodeIn(tx store.ReadTxn, nodeID string) (*tetherv1.Node, error) {
	return GetNodeIn(tx, nodeID)
}

// SubtreeIn returns rootID's node and its descendants inside a transaction.
func (t *Tree) SubtreeIn(tx store.ReadTxn, rootID string) ([]*tetherv1.Node, error) {
	return SubtreeIn(tx, rootID)
}

// NodeNotFound reports whether err wraps ErrNodeNotFound.
func (t *Tree) NodeNotFound(err error) bool { return errors.Is(err, ErrNodeNotFound) }

// PrefetchNodesIn fetches the nodes together ahead of GetNodeIn
// (store.Prefetch): on etcd one request for many, not a round trip each.
func (t *Tree) PrefetchNodesIn(tx store.ReadTxn, nodeIDs []string) error {
	keys := make([][]byte, len(nodeIDs))
	for i, id := range nodeIDs {
		keys[i] = nodeKey(id)
	}
	return store.Prefetch(tx, keys, nil)
}
