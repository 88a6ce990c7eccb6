package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
// subtree_pages yourself. req.one_level is refused. A page the control
// plane never answers ends the listing with an error: one of more nodes
// than page_size (or 1,000), a next_page_token answered before (a path to
// the control plane that repeats, alternates or cycles its pages), a
// listing past MaxPages answers.
func ListSubtree(ctx context.Context, c tetherv1connect.AgentServiceClient, req *tetherv1.ListNodesRequest) ([]*tetherv1.Node, error) {
	if req.OneLevel {
		return nil, errors.New("agentsdk: ListSubtree lists a subtree, not one level (one_level)")
	}
	// The most nodes a page of the control plane's holds: page_size, at
	// most and by default 1,000 (the nodes a call reads).
	most := 1000
	if req.PageSize > 0 && req.PageSize < 1000 {
		most = int(req.PageSize)
	}
	var out []*tetherv1.Node
	walk := newPageWalk("ListSubtree", req.PageToken)
	page := &tetherv1.ListNodesRequest{RootNodeId: req.RootNodeId, LabelSelector: req.LabelSelector, PageSize: req.PageSize, PageToken: req.PageToken, SubtreePages: true}
	for {
		resp, err := c.ListNodes(ctx, connect.NewRequest(page))
		if err != nil {
			return nil, err
		}
		if n := len(resp.Msg.Nodes); n > most {
			return nil, fmt.Errorf("agentsdk: ListSubtree: a page of %d nodes, where the control plane's hold at most %d", n, most)
		}
		out = append(out, resp.Msg.Nodes...)
		next := resp.Msg.NextPageToken
		if next == "" {
			return out, nil
		}
		// A continuation that does not move on (the page asked for, or
		// any earlier one) would be asked for for ever.
		if err := walk.next(next); err != nil {
			return nil, err
		}
		page = &tetherv1.ListNodesRequest{RootNodeId: req.RootNodeId, LabelSelector: req.LabelSelector, PageSize: req.PageSize, PageToken: next, SubtreePages: true}
	}
}

// AncestorPaths names each node's ancestors, root first, by name and
// separated by "/" (which no name holds), "-" for a root: names are not
// unique, and a rogue's child named worker-2 with worker-2's labels reads
// in a listing as the real one but for two ids. An ancestor among nodes
// is named from them, another read once with c (at most maxReads of
// them), one not read (past the bound, or not the caller's to read) by
// its id. The CLI's `agent ls` and the console's filtered tree view name
// their rows' ancestors with it.
func AncestorPaths(ctx context.Context, c tetherv1connect.AgentServiceClient, nodes []*tetherv1.Node, maxReads int) map[string]string {
	names := make(map[string]string, len(nodes))
	for _, n := range nodes {
		names[n.NodeId] = n.Name
	}
	reads := 0
	paths := make(map[string]string, len(nodes))
	for _, n := range nodes {
		if len(n.Ancestors) == 0 {
			paths[n.NodeId] = "-"
			continue
		}
		parts := make([]string, len(n.Ancestors))
		for i, a := range n.Ancestors {
			name, ok := names[a]
			if !ok && reads < maxReads {
				reads++
				name = a
				// An answer naming another node, or none (a path to the
				// control plane forging it), leaves the id.
				if got, err := c.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: a})); err == nil && got.Msg.GetNode().GetNodeId() == a {
					name = got.Msg.Node.Name
				}
				names[a], ok = name, true
			}
			if !ok {
				name = a
			}
			parts[i] = name
		}
		paths[n.NodeId] = strings.Join(parts, "/")
	}
	return paths
}
