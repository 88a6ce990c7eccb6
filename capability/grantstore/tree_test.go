package grantstore

import (
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// agentTree is the supervisor's tree as grantstore reads it (Tree), as
// controlplane wires it: the tests run against the real tree.
type agentTree struct{ *tree.Tree }

func (a agentTree) GetNodeIn(tx store.ReadTxn, nodeID string) (*Node, error) {
	n, err := a.Tree.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, err
	}
	return &Node{NodeID: n.NodeID, Ancestors: n.Ancestors, State: tree.StateName(n.State)}, nil
}

func (a agentTree) SubtreeIn(tx store.ReadTxn, rootID string) ([]*Node, error) {
	nodes, err := a.Tree.SubtreeIn(tx, rootID)
	if err != nil {
		return nil, err
	}
	out := make([]*Node, len(nodes))
	for i, n := range nodes {
		out[i] = &Node{NodeID: n.NodeID, Ancestors: n.Ancestors, State: tree.StateName(n.State)}
	}
	return out, nil
}
