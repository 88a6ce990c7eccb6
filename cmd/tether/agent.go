package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/sortedmap"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

func newAgentCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "agent", Short: "Register, spawn and inspect agents"}
	cmd.AddCommand(agentRegister(g), agentSpawn(g), agentList(g), agentTree(g), agentShow(g))
	return cmd
}

func parseLabels(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("--label %q: want k=v", p)
		}
		out[k] = v
	}
	return out, nil
}

func agentRegister(g *globals) *cobra.Command {
	return agentRegistration(g, "register --name NAME [--label k=v]", "Register a root agent (operators)",
		func(ctx context.Context, c *clients, name string, labels map[string]string) (registeredAnswer, error) {
			return answer(c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name, Labels: labels})))
		})
}

func agentSpawn(g *globals) *cobra.Command {
	var parent string
	cmd := agentRegistration(g, "spawn --parent NODE --name NAME [--label k=v]", "Spawn a child agent under a running parent",
		func(ctx context.Context, c *clients, name string, labels map[string]string) (registeredAnswer, error) {
			return answer(c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: name, Labels: labels})))
		})
	cmd.Flags().StringVar(&parent, "parent", "", "parent node id")
	return cmd
}

// agentRegistration is a command that registers an agent (a root, or a
// child by spawning it) with --name and --label, and prints its node and
// credential.
func agentRegistration(g *globals, use, short string, register func(ctx context.Context, c *clients, name string, labels map[string]string) (registeredAnswer, error)) *cobra.Command {
	var name string
	var labels []string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			l, err := parseLabels(labels)
			if err != nil {
				return err
			}
			msg, err := register(cmd.Context(), c, name, l)
			if err != nil {
				return err
			}
			return printRegistered(g, cmd, msg)
		}),
	}
	cmd.Flags().StringVar(&name, "name", "", "agent name")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label k=v (repeatable)")
	addPrintFlag(cmd, "credential", "node_id")
	return cmd
}

// registeredAnswer is the answer of a call that registers an agent: its
// node and its credential.
type registeredAnswer interface {
	proto.Message
	GetNode() *tetherv1.Node
	GetCredential() string
}

// printRegistered prints the field --print names, or the whole answer.
func printRegistered(g *globals, cmd *cobra.Command, msg registeredAnswer) error {
	if err := carried("node", "", "", msg.GetNode().GetNodeId() != "" && msg.GetCredential() != ""); err != nil {
		return err
	}
	if done, err := g.printedAsAsked(cmd, msg); done || err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	n, credential := msg.GetNode(), msg.GetCredential()
	fmt.Fprintf(w, "node_id:     %s\nname:        %s\nparent:      %s\nstate:       %s\ncredential:  %s\n",
		n.NodeId, n.Name, orDash(n.ParentNodeId), tree.StateName(tree.NodeState(n.State)), credential)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// The CLI's listings are bounded, whatever an agent spawned: `agent ls`
// prints a page of nodes (lsLimit by default) from at most lsCalls
// listings and the token of the next; `agent tree` reads one level at a
// time, breadth first, at most treeLimit nodes by default and treeCalls
// listings, and names the command that shows the rest.
const (
	lsLimit   = 1000
	lsCalls   = 10
	treeLimit = 500
	treeCalls = 40
	maxLimit  = 10000
)

// checkLimit refuses a --limit out of 1..maxLimit.
// limitFlag is --limit's value for a next-page line: "" when it is the
// default.
func limitFlag(limit, def int) string {
	if limit == def {
		return ""
	}
	return strconv.Itoa(limit)
}

func checkLimit(limit int) error {
	if limit < 1 || limit > maxLimit {
		return fmt.Errorf("--limit %d: want 1 to %d", limit, maxLimit)
	}
	return nil
}

func agentList(g *globals) *cobra.Command {
	var selector, root, token string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [--root NODE] [--selector k=v] [--limit N] [--page-token T]",
		Short: "List agents, a page at a time",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			var nodes []*tetherv1.Node
			// A page may hold fewer matches than asked (the server reads a
			// thousand nodes a call, matching the selector or not). A
			// subtree (--root, or an agent's own) is read a page at a time
			// too (subtree_pages), never whole: a rogue's subtree grown
			// past what one answer may carry is still listed.
			for calls := 0; calls < lsCalls && len(nodes) < limit; calls++ {
				resp, err := c.Agent.ListNodes(cmd.Context(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root, LabelSelector: selector, PageToken: token, PageSize: int32(min(limit-len(nodes), maxLimit)), SubtreePages: true}))
				if err != nil {
					return err
				}
				nodes = append(nodes, resp.Msg.Nodes...)
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			more := ""
			switch {
			case len(nodes) > limit:
				// A subtree answered whole, by a server that does not page
				// it.
				at := root
				if at == "" {
					at = "NODE"
				}
				more = fmt.Sprintf("… %d more nodes of the subtree not shown: draw it a level at a time with tether agent tree %s", len(nodes)-limit, at)
				nodes = nodes[:limit]
			case token != "":
				more = "… more: tether agent ls --page-token " + token
				if root != "" {
					more += " --root " + root
				}
				if selector != "" {
					more += " --selector " + selector
				}
				if limit != lsLimit {
					more += " --limit " + strconv.Itoa(limit)
				}
			}
			if more != "" {
				if asJSON, _ := g.wantJSON(); asJSON {
					fmt.Fprintln(cmd.ErrOrStderr(), more)
					more = ""
				}
			}
			var paths map[string]string
			if asJSON, _ := g.wantJSON(); !asJSON {
				paths = agentsdk.AncestorPaths(cmd.Context(), c.Agent, nodes, maxPathReads)
			}
			if err := printList(g, cmd.OutOrStdout(), nodes, "NODE\tNAME\tPATH\tPARENT\tSTATE\tLABELS", func(n *tetherv1.Node) []string {
				return []string{n.NodeId, n.Name, paths[n.NodeId], orDash(n.ParentNodeId), tree.StateName(tree.NodeState(n.State)), formatLabels(n.Labels)}
			}); err != nil || more == "" {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		}),
	}
	cmd.Flags().StringVar(&selector, "selector", "", "label selector k=v,k2=v2")
	cmd.Flags().StringVar(&root, "root", "", "list only this node's subtree, depth first, a page at a time")
	cmd.Flags().IntVar(&limit, "limit", lsLimit, "print at most this many nodes (1 to 10000)")
	cmd.Flags().StringVar(&token, "page-token", "", "the next page's token, as the previous page printed it")
	return cmd
}

// maxPathReads bounds the nodes `agent ls` reads to name the ancestors
// of a page's nodes that the page does not hold; past it an ancestor is
// named by its id.
const maxPathReads = 100

func formatLabels(l map[string]string) string {
	return sortedmap.Join(l, "-", ",", func(k, v string) string { return k + "=" + v })
}

func agentShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show NODE",
		Short: "Show one agent",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.Agent.GetNode(cmd.Context(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: args[0]}))
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg.Node); done || err != nil {
				return err
			}
			n := resp.Msg.Node
			if n == nil {
				return errors.New("the server answered no node")
			}
			// Its ancestors by name and id, root first (a read each; the
			// tree is at most 32 deep): names are not unique, and a rogue's
			// child named "root" read as the root but for two ids.
			path := make([]string, 0, len(n.Ancestors)+1)
			for _, a := range n.Ancestors {
				an, err := c.Agent.GetNode(cmd.Context(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: a}))
				if err != nil || an.Msg.GetNode().GetNodeId() != a {
					path = append(path, a)
					continue
				}
				path = append(path, an.Msg.Node.Name+" ("+a+")")
			}
			path = append(path, n.Name)
			fmt.Fprintf(cmd.OutOrStdout(), "node_id:  %s\nname:     %s\nparent:   %s\npath:     %s\nstate:    %s\nlabels:   %s\ncreated:  %s by %s\n",
				n.NodeId, n.Name, orDash(n.ParentNodeId), printable(strings.Join(path, " / ")), tree.StateName(tree.NodeState(n.State)), formatLabels(n.Labels), n.CreatedAt.AsTime().Format("2006-01-02T15:04:05Z07:00"), n.CreatedBy)
			return nil
		}),
	}
}

// treeEntry is a node `agent tree` read, with the children it read of
// it.
type treeEntry struct {
	node    *tetherv1.Node
	kids    []*treeEntry
	count   uint64 // its stored number of children, when known
	counted bool
	next    string // the token of its next page of children
	unread  bool   // it has children and none were read
}

func agentTree(g *globals) *cobra.Command {
	var limit int
	var after string
	cmd := &cobra.Command{
		Use:   "tree NODE [--limit N] [--after T]",
		Short: "Draw a node's subtree, a level at a time",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			got, err := c.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: args[0]}))
			if err != nil {
				return err
			}
			top := &treeEntry{node: got.Msg.Node}
			read := []*tetherv1.Node{top.node}
			budget, calls := limit, 0
			// list reads a page of e's children (one level, never the
			// subtree below them).
			list := func(e *treeEntry, token string) error {
				resp, err := c.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: e.node.NodeId, OneLevel: true, PageToken: token, PageSize: int32(min(budget, 1000))}))
				calls++
				if err != nil {
					return err
				}
				e.count, e.counted = resp.Msg.ChildCounts[e.node.NodeId]
				for _, n := range resp.Msg.Nodes {
					k := &treeEntry{node: n}
					k.count, k.counted = resp.Msg.ChildCounts[n.NodeId]
					e.kids = append(e.kids, k)
					read = append(read, n)
				}
				sort.Slice(e.kids, func(i, j int) bool {
					a, b := e.kids[i].node, e.kids[j].node
					return a.Name+a.NodeId < b.Name+b.NodeId
				})
				budget -= len(resp.Msg.Nodes)
				e.next = resp.Msg.NextPageToken
				return nil
			}
			if err := list(top, after); err != nil {
				return err
			}
			for level := top.kids; len(level) > 0; {
				var next []*treeEntry
				for _, e := range level {
					if e.counted && e.count == 0 {
						continue
					}
					if budget <= 0 || calls >= treeCalls {
						e.unread = true
						continue
					}
					if err := list(e, ""); err != nil {
						return err
					}
					next = append(next, e.kids...)
				}
				level = next
			}
			if done, err := printedAsJSONList(g, cmd.OutOrStdout(), read); done || err != nil {
				return err
			}
			children := func(e *treeEntry) string {
				if e.counted {
					return fmt.Sprintf("%d children", e.count)
				}
				return "children"
			}
			label := func(e *treeEntry) string {
				n := e.node
				l := fmt.Sprintf("%s (%s) [%s]", n.Name, n.NodeId, tree.StateName(tree.NodeState(n.State)))
				switch {
				case e.unread && e.counted:
					l += fmt.Sprintf(" … %s not read: tether agent tree %s", children(e), n.NodeId)
				case e.unread:
					l += " … its children not read: tether agent tree " + n.NodeId
				case e.next != "":
					l += fmt.Sprintf(" … %s, %d shown: tether agent tree %s --after %s", children(e), len(e.kids), n.NodeId, e.next)
				}
				return l
			}
			drawTree(cmd.OutOrStdout(), top, func(e *treeEntry) []*treeEntry { return e.kids }, label)
			return nil
		}),
	}
	cmd.Flags().IntVar(&limit, "limit", treeLimit, "read and draw at most this many nodes below NODE (1 to 10000)")
	cmd.Flags().StringVar(&after, "after", "", "start NODE's children after this one (the token a previous drawing printed)")
	return cmd
}

// drawTree prints root and its descendants with box-drawing branches.
func drawTree[T any](w io.Writer, root T, children func(T) []T, label func(T) string) {
	fmt.Fprintln(w, label(root))
	var walk func(n T, prefix string)
	walk = func(n T, prefix string) {
		kids := children(n)
		for i, k := range kids {
			branch, next := "├── ", "│   "
			if i == len(kids)-1 {
				branch, next = "└── ", "    "
			}
			fmt.Fprintln(w, prefix+branch+label(k))
			walk(k, prefix+next)
		}
	}
	walk(root, "")
}
