package agentsdk

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// ListSubtree lists the subtree of req's root_node_id (an agent's own
// subtree when empty) whole, matching req's label_selector, depth first
// with each node's children in id order, a page at a time: it asks for the
// subtree's pages (ListNodes subtree_pages, page_size nodes read a call,
// the server's 1,000 at most and by default) and follows their
// next_page_token to the end. ListNodes with a root and without
// subtree_pages answers the subtree in one message, which a rogue in it
// makes larger than the connection reads (MaxMessageBytes: about 3,800
// nodes carrying every label allowed) simply by spawning, so that its
// parent's or an operator's listing of it fails; each page here is
// bounded however large the subtree grew. Each page is its own snapshot
// (a node spawned meanwhile is listed if the walk has not passed its place
// yet), and each is a request of the caller's rate budget. The nodes are
// all held in memory: to look at a page at a time, call ListNodes with
// subtree_pages yourself. req.one_level is refused.
func ListSubtree(ctx context.Context, c tetherv1connect.AgentServiceClient, req *tetherv1.ListNodesRequest) ([]*tetherv1.Node, error) {
	if req.OneLevel {
		return nil, errors.New("agentsdk: ListSubtree lists a subtree, not one level (one_level)")
	}
	var out []*tetherv1.Node
	page := &tetherv1.ListNodesRequest{RootNodeId: req.RootNodeId, LabelSelector: req.LabelSelector, PageSize: req.PageSize, PageToken: req.PageToken, SubtreePages: true}
	for {
		resp, err := c.ListNodes(ctx, connect.NewRequest(page))
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Msg.Nodes...)
		next := resp.Msg.NextPageToken
		if next == "" {
			return out, nil
		}
		if next == page.PageToken {
			// A continuation that does not move on would be asked for
			// for ever.
			return nil, errors.New("agentsdk: ListSubtree: the control plane answered the page it was asked for as the next one")
		}
		page = &tetherv1.ListNodesRequest{RootNodeId: req.RootNodeId, LabelSelector: req.LabelSelector, PageSize: req.PageSize, PageToken: next, SubtreePages: true}
	}
}
