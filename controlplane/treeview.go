package controlplane

import (
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// grantTree is the agent tree as the capability layer reads it
// (grantstore.Tree): grantstore never imports the supervisor.
type grantTree struct{ t *tree.Tree }

func (g grantTree) GetNodeIn(tx store.ReadTxn, nodeID string) (*grantstore.Node, error) {
	n, err := g.t.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, err
	}
	return grantNode(n), nil
}

func (g grantTree) SubtreeIn(tx store.ReadTxn, rootID string) ([]*grantstore.Node, error) {
	nodes, err := g.t.SubtreeIn(tx, rootID)
	if err != nil {
		return nil, err
	}
	out := make([]*grantstore.Node, len(nodes))
	for i, n := range nodes {
		out[i] = grantNode(n)
	}
	return out, nil
}

func (g grantTree) NodeNotFound(err error) bool { return g.t.NodeNotFound(err) }

// NoteHolderIn notes that the node holds a grant (tree.Tree.NoteHolderIn).
func (g grantTree) NoteHolderIn(tx store.Txn, nodeID string) error {
	return g.t.NoteHolderIn(tx, nodeID)
}

// PrefetchNodesIn lets a revocation fetch its grants' holders together
// (grantstore prefetches through it when the Tree has it): on etcd one
// request for a batch of grants, not a read per grant.
func (g grantTree) PrefetchNodesIn(tx store.ReadTxn, nodeIDs []string) error {
	return g.t.PrefetchNodesIn(tx, nodeIDs)
}

// NodeKeys names the holders' keys, so that a revocation fetches them
// with its grants (grantstore reads them in the same request when the
// Tree has it).
func (g grantTree) NodeKeys(nodeIDs []string) [][]byte { return g.t.NodeKeys(nodeIDs) }

// StopCoveringIn describes the stop covering the running node n before
// its mark reaches it (tree.CoveringStopIn: a stopping ancestor, or a stop
// requested on n or an ancestor), or "" (grantstore.StopCoverer).
func (g grantTree) StopCoveringIn(tx store.ReadTxn, n *grantstore.Node) (string, error) {
	cover, err := tree.CoveringStopIn(tx, &tree.Node{NodeID: n.NodeID, Ancestors: n.Ancestors})
	if err != nil || cover == nil {
		return "", err
	}
	return cover.Describe(n.NodeID), nil
}

func grantNode(n *tree.Node) *grantstore.Node {
	return &grantstore.Node{NodeID: n.NodeID, Ancestors: n.Ancestors, State: tree.StateName(n.State)}
}
