package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/auth"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/tree"
)

type agentService struct {
	tetherv1connect.UnimplementedAgentServiceHandler
	s *Server
}

// agentActive is the interceptor's check that an agent credential's node may
// still act: the credential dies with the node's termination, and from the
// moment its exit is confirmed every call with it (but a repeated
// ConfirmExit) is refused and kept on the node as contradicting evidence.
// It returns the node's lineage (the root of its tree), which the rate
// limiter charges.
func (s *Server) agentActive(ctx context.Context, nodeID string) (string, error) {
	procedure := auth.ProcedureFromContext(ctx)
	if procedure == tetherv1connect.AgentServiceConfirmExitProcedure {
		return s.nodeAlive(ctx, nodeID)
	}
	return s.agentAct(ctx, nodeID, activityOf(procedure), "a call to "+procedure)
}

// activityOf names the kind of activity a procedure is, for the record.
func activityOf(procedure string) string {
	switch {
	case procedure == tetherv1connect.AgentServiceSpawnProcedure:
		return tree.ActivitySpawn
	case procedure == tetherv1connect.AgentServiceSessionProcedure, procedure == tetherv1connect.AgentServiceWatchSignalsProcedure:
		return tree.ActivitySession
	case procedure == tetherv1connect.CapabilityServiceDelegateProcedure:
		return tree.ActivityDelegate
	case procedure == tetherv1connect.CapabilityServiceRefreshProcedure:
		return tree.ActivityRefresh
	case strings.HasPrefix(procedure, "/"+tetherv1connect.LeaseServiceName+"/"):
		return tree.ActivityLease
	}
	return tree.ActivityRequest
}

// agentAct refuses activity from a node that is terminated or unknown
// (revoked) or whose exit was confirmed (FailedPrecondition, kept as a
// contradiction), and returns its lineage.
func (s *Server) agentAct(ctx context.Context, nodeID, kind, detail string) (string, error) {
	n, err := s.tree.Act(ctx, nodeID, kind, detail)
	switch {
	case errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument):
		return "", fmt.Errorf("%w: the credential's node is unknown", auth.ErrRevoked)
	case errors.Is(err, tree.ErrNodeExited):
		return "", connect.NewError(connect.CodeFailedPrecondition, err)
	case err != nil:
		return "", err
	case n.State == tetherv1.NodeState_NODE_STATE_TERMINATED:
		return "", fmt.Errorf("%w: node %s is terminated", auth.ErrRevoked, nodeID)
	}
	return lineageOf(n), nil
}

// lineageOf is the root of a node's tree.
func lineageOf(n *tetherv1.Node) string {
	if len(n.Ancestors) > 0 {
		return n.Ancestors[0]
	}
	return n.NodeId
}

// nodeAlive is agentActive without the exit check: the node is neither
// terminated nor unknown.
func (s *Server) nodeAlive(ctx context.Context, nodeID string) (string, error) {
	n, err := s.tree.Get(ctx, nodeID)
	if errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument) {
		return "", fmt.Errorf("%w: the credential's node is unknown", auth.ErrRevoked)
	}
	if err != nil {
		return "", err
	}
	if n.State == tetherv1.NodeState_NODE_STATE_TERMINATED {
		return "", fmt.Errorf("%w: node %s is terminated", auth.ErrRevoked, nodeID)
	}
	return lineageOf(n), nil
}

func (a *agentService) RegisterRoot(ctx context.Context, req *connect.Request[tetherv1.RegisterRootRequest]) (*connect.Response[tetherv1.RegisterRootResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	node, err := a.s.tree.RegisterRoot(ctx, req.Msg.Name, req.Msg.Labels, p.ID())
	if err != nil {
		return nil, toConnect(err)
	}
	cred, exp, err := a.s.issuer.MintAgent(node.NodeId, a.s.cfg.Clock.Now(), a.s.cfg.AgentCredentialTTL)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RegisterRootResponse{Node: node, Credential: cred, CredentialExpiresAt: timestamppb.New(exp)}), nil
}

func (a *agentService) Spawn(ctx context.Context, req *connect.Request[tetherv1.SpawnRequest]) (*connect.Response[tetherv1.SpawnResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	authorize := func(parent *tetherv1.Node) error {
		// An agent spawns only under its own node: an agent cannot grow
		// another agent's subtree.
		if p.IsAgent() && parent.NodeId != p.NodeID() {
			return fmt.Errorf("%w: agent %s may spawn only under its own node, not parent_node_id %s", auth.ErrDenied, p.NodeID(), parent.NodeId)
		}
		return nil
	}
	node, err := a.s.tree.Spawn(ctx, req.Msg.ParentNodeId, req.Msg.Name, req.Msg.Labels, p.ID(), authorize)
	if err != nil {
		return nil, toConnect(err)
	}
	cred, exp, err := a.s.issuer.MintAgent(node.NodeId, a.s.cfg.Clock.Now(), a.s.cfg.AgentCredentialTTL)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.SpawnResponse{Node: node, Credential: cred, CredentialExpiresAt: timestamppb.New(exp)}), nil
}

// canSee says whether p may read node n: operators see everything, an agent
// sees its own subtree.
func canSee(p auth.Principal, n *tetherv1.Node) bool {
	return !p.IsAgent() || n.NodeId == p.NodeID() || tree.IsAncestor(n, p.NodeID())
}

func (a *agentService) GetNode(ctx context.Context, req *connect.Request[tetherv1.GetNodeRequest]) (*connect.Response[tetherv1.GetNodeResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	n, err := a.s.tree.Get(ctx, req.Msg.NodeId)
	if err != nil {
		return nil, toConnect(err)
	}
	if !canSee(p, n) {
		return nil, denied("agent %s may read only its own subtree, not node_id %s", p.NodeID(), n.NodeId)
	}
	return connect.NewResponse(&tetherv1.GetNodeResponse{Node: n}), nil
}

const maxPageSize = 1000

func (a *agentService) ListNodes(ctx context.Context, req *connect.Request[tetherv1.ListNodesRequest]) (*connect.Response[tetherv1.ListNodesResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	selector, err := tree.ParseSelector(req.Msg.LabelSelector)
	if err != nil {
		return nil, toConnect(err)
	}
	if req.Msg.PageSize < 0 {
		return nil, invalid("page_size must not be negative")
	}
	root := req.Msg.RootNodeId
	if root == "" && p.IsAgent() {
		root = p.NodeID()
	}
	if root == "" {
		size := int(req.Msg.PageSize)
		if size == 0 || size > maxPageSize {
			size = maxPageSize
		}
		nodes, next, err := a.s.tree.List(ctx, selector, req.Msg.PageToken, size)
		if err != nil {
			return nil, toConnect(err)
		}
		return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: nodes, NextPageToken: next}), nil
	}
	nodes, err := a.s.tree.Subtree(ctx, root)
	if err != nil {
		return nil, toConnect(err)
	}
	if !canSee(p, nodes[0]) {
		return nil, denied("agent %s may list only its own subtree, not root_node_id %s", p.NodeID(), root)
	}
	out := nodes[:0]
	for _, n := range nodes {
		if tree.MatchLabels(n.Labels, selector) {
			out = append(out, n)
		}
	}
	return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: out}), nil
}
