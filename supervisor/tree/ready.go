package tree

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// ReportReady records that a running node is ready to take work (its own
// word, or its launcher's). The first report's time is kept; a node that
// is stopping or stopped cannot become ready.
func (t *Tree) ReportReady(ctx context.Context, nodeID string, authorize func(*tetherv1.Node) error) (*tetherv1.Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	now := timestamppb.New(t.Clock.Now())
	return t.updateNode(ctx, nodeID, authorize, func(tx store.Txn, n *tetherv1.Node) error {
		if n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
			return fmt.Errorf("%w: node %s is %s and cannot become ready", ErrNodeStopping, nodeID, StateName(n.State))
		}
		if n.ReadyAt != nil {
			return nil
		}
		n.ReadyAt = now
		return putNode(tx, n)
	})
}

// updateNode runs fn on the node in one transaction, once authorize (when
// set) accepts it, and returns the node as fn left it (written or not).
func (t *Tree) updateNode(ctx context.Context, nodeID string, authorize func(*tetherv1.Node) error, fn func(tx store.Txn, n *tetherv1.Node) error) (*tetherv1.Node, error) {
	var out *tetherv1.Node
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getNode(tx, nodeID)
		if err != nil {
			return err
		}
		if authorize != nil {
			if err := authorize(n); err != nil {
				return err
			}
		}
		out = n
		return fn(tx, n)
	})
	return out, err
}
