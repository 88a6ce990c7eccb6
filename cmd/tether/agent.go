package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

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

func agentList(g *globals) *cobra.Command {
	var selector, root string
	cmd := &cobra.Command{
		Use:   "ls [--root NODE] [--selector k=v]",
		Short: "List agents",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			nodes, err := allPages(func(token string) ([]*tetherv1.Node, string, error) {
				resp, err := c.Agent.ListNodes(cmd.Context(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root, LabelSelector: selector, PageToken: token}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.Nodes, resp.Msg.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			return printList(g, cmd.OutOrStdout(), nodes, "NODE\tNAME\tPARENT\tSTATE\tLABELS", func(n *tetherv1.Node) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", n.NodeId, n.Name, orDash(n.ParentNodeId), tree.StateName(tree.NodeState(n.State)), formatLabels(n.Labels))
			})
		}),
	}
	cmd.Flags().StringVar(&selector, "selector", "", "label selector k=v,k2=v2")
	cmd.Flags().StringVar(&root, "root", "", "list only this node's subtree")
	return cmd
}

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
			fmt.Fprintf(cmd.OutOrStdout(), "node_id:  %s\nname:     %s\nparent:   %s\nstate:    %s\nlabels:   %s\ncreated:  %s by %s\n",
				n.NodeId, n.Name, orDash(n.ParentNodeId), tree.StateName(tree.NodeState(n.State)), formatLabels(n.Labels), n.CreatedAt.AsTime().Format("2006-01-02T15:04:05Z07:00"), n.CreatedBy)
			return nil
		}),
	}
}

func agentTree(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tree NODE",
		Short: "Draw a node's subtree",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.Agent.ListNodes(cmd.Context(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: args[0]}))
			if err != nil {
				return err
			}
			if done, err := printedAsJSONList(g, cmd.OutOrStdout(), resp.Msg.Nodes); done || err != nil {
				return err
			}
			children := map[string][]*tetherv1.Node{}
			for _, n := range resp.Msg.Nodes {
				children[n.ParentNodeId] = append(children[n.ParentNodeId], n)
			}
			label := func(n *tetherv1.Node) string {
				return fmt.Sprintf("%s (%s) [%s]", n.Name, n.NodeId, tree.StateName(tree.NodeState(n.State)))
			}
			drawTree(cmd.OutOrStdout(), resp.Msg.Nodes[0], func(n *tetherv1.Node) []*tetherv1.Node {
				kids := children[n.NodeId]
				sort.Slice(kids, func(i, j int) bool { return kids[i].Name+kids[i].NodeId < kids[j].Name+kids[j].NodeId })
				return kids
			}, label)
			return nil
		}),
	}
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
