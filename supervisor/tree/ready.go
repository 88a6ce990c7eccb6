package tree

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
)

// ReportReady records that a running node is ready to take work (its own
// word, or its launcher's). The first report's time is kept; a node that
// is stopping or stopped, or under a stop whose mark has not reached it,
// cannot become ready, and a repeat of a report it made before is refused
// as a first one would be.
func (t *Tree) ReportReady(ctx context.Context, nodeID string, authorize func(*Node) error) (*Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	now := t.Clock.Now()
	return t.updateNode(ctx, nodeID, authorize, func(tx store.Txn, n *Node) error {
		if n.State != NodeStateRunning {
			return fmt.Errorf("%w: node %s is %s and cannot become ready", ErrNodeStopping, nodeID, StateName(n.State))
		}
		// Nor under a stop whose mark has not reached it (requested on it
		// or an ancestor, or marked down to an ancestor): the workload of
		// a termination does not report itself ready to take over work (a
		// rollout counts a replacement, and hands it jobs, on this word).
		// A repeat of a report made before the stop is refused too: the
		// answer does not depend on whether the node spoke before.
		cover, err := CoveringStopIn(tx, n)
		if err != nil {
			return err
		}
		if cover != nil {
			return fmt.Errorf("%w: %s and cannot become ready", ErrNodeStopping, cover.Describe(nodeID))
		}
		if !n.ReadyAt.IsZero() {
			return nil
		}
		n.ReadyAt = now
		return putNode(tx, n)
	})
}

// updateNode runs fn on the node in one transaction, once authorize (when
// set) accepts it, and returns the node as fn left it (written or not).
func (t *Tree) updateNode(ctx context.Context, nodeID string, authorize func(*Node) error, fn func(tx store.Txn, n *Node) error) (*Node, error) {
	var out *Node
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getAuthorized(tx, nodeID, authorize)
		if err != nil {
			return err
		}
		out = n
		return fn(tx, n)
	})
	return out, err
}

// getAuthorized reads a node, which authorize (when set) must accept.
func getAuthorized(tx store.ReadTxn, nodeID string, authorize func(*Node) error) (*Node, error) {
	return GetAuthorizedIn(tx, nodeID, authorize)
}

// GetAuthorizedIn reads a node that authorize (when set) must accept. A
// node that does not exist is put to authorize as a bare stand-in (its id,
// no ancestors): a caller refused any node outside its reach (an agent
// naming another tree's node) gets that refusal for an id that names
// nothing too, in the same words, so its answer never says whether the
// id it named exists; a caller authorize accepts (an operator) is told
// the node does not exist.
func GetAuthorizedIn(tx store.ReadTxn, nodeID string, authorize func(*Node) error) (*Node, error) {
	n, err := getNode(tx, nodeID)
	if errors.Is(err, ErrNodeNotFound) && authorize != nil {
		if refused := authorize(&Node{NodeID: nodeID}); refused != nil {
			return nil, refused
		}
	}
	if err != nil {
		return nil, err
	}
	if authorize != nil {
		if err := authorize(n); err != nil {
			return nil, err
		}
	}
	return n, nil
}
