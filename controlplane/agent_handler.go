package controlplane

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
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
	return s.agentActAs(ctx, nodeID, activityOf(procedure), "a call to "+procedure, refusedWhileStopping[procedure])
}

// refusedWhileStopping are the procedures a stop refuses to a node it
// covers (docs/design.md §4): a draining or aborting node's call to one is
// not served, and is not weighed against its ancestors' claims
// (tree.NoteAtWorkAfterClaims) — an honest parent that exited on its
// drain while its rogue child, which never had a session, tried a spawn,
// reads confirmed.
var refusedWhileStopping = map[string]bool{
	tetherv1connect.AgentServiceSpawnProcedure:                  true,
	tetherv1connect.AgentServiceSpawnBatchProcedure:             true,
	tetherv1connect.AgentServiceProposeStopProcedure:            true,
	tetherv1connect.AgentServiceReportReadyProcedure:            true,
	tetherv1connect.CapabilityServiceDelegateProcedure:          true,
	tetherv1connect.CapabilityServiceRefreshProcedure:           true,
	tetherv1connect.SupervisorServiceRegisterPrivilegeProcedure: true,
}

// activityOf names the kind of activity a procedure is, for the record.
func activityOf(procedure string) string {
	switch {
	case procedure == tetherv1connect.AgentServiceSpawnProcedure, procedure == tetherv1connect.AgentServiceSpawnBatchProcedure:
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
// contradiction), and returns its lineage. A node that may act is remembered (activeNodes) until it changes, so an
// agent's calls do not read its node each time.
func (s *Server) agentAct(ctx context.Context, nodeID, kind, detail string) (string, error) {
	return s.agentActAs(ctx, nodeID, kind, detail, false)
}

// agentActAs is agentAct for a request that a stop covering the node
// refuses when refusedWhileStopping. A request of a node that never had a
// session (tree.NeverSessioned) is weighed against its ancestors' claims
// of exit (tree.NoteAtWorkAfterClaims, one read of its ancestors), unless
// it is stopping and the request one its stop refuses; such a node is
// remembered only while none of its ancestors changes after that read
// (activeNodes), so the request after an ancestor's claim is weighed
// again. Until the thirty-seventh pass a rogue parent that claimed its
// exit and worked on with such a child's credential read confirmed by
// the control plane.
func (s *Server) agentActAs(ctx context.Context, nodeID, kind, detail string, refusedWhileStopping bool) (string, error) {
	lineage, ok, gen := s.active.lookup(nodeID)
	if ok {
		return lineage, nil
	}
	n, err := s.tree.Act(ctx, nodeID, kind, detail)
	switch {
	case errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument):
		return "", fmt.Errorf("%w: the credential's node is unknown", auth.ErrRevoked)
	case errors.Is(err, tree.ErrNodeExited):
		return "", connect.NewError(connect.CodeFailedPrecondition, err)
	case err != nil:
		return "", err
	case n.State == tree.NodeStateTerminated:
		return "", fmt.Errorf("%w: node %s is terminated", auth.ErrRevoked, nodeID)
	}
	lineage = lineageOf(n)
	if tree.NeverSessioned(n) {
		stopping := n.State == tree.NodeStateDraining || n.State == tree.NodeStateAborting
		if refusedWhileStopping && stopping {
			return lineage, nil
		}
		if err := s.tree.NoteAtWorkAfterClaims(ctx, n, kind); err != nil {
			return "", err
		}
	}
	s.active.remember(n, gen)
	return lineage, nil
}

// lineageOf is the root of a node's tree.
func lineageOf(n *tree.Node) string {
	if len(n.Ancestors) > 0 {
		return n.Ancestors[0]
	}
	return n.NodeID
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
	if n.State == tree.NodeStateTerminated {
		return "", fmt.Errorf("%w: node %s is terminated", auth.ErrRevoked, nodeID)
	}
	return lineageOf(n), nil
}

func (a *agentService) RegisterRoot(ctx context.Context, req *connect.Request[tetherv1.RegisterRootRequest]) (*connect.Response[tetherv1.RegisterRootResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	node, err := a.s.tree.RegisterRootBy(ctx, req.Msg.Name, req.Msg.Labels, asCaller(p))
	if err != nil {
		return nil, toConnect(err)
	}
	cred, exp, err := a.s.authn.MintAgent(node.NodeID, lineageOf(node), a.s.cfg.Clock.Now(), a.s.cfg.AgentCredentialTTL)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RegisterRootResponse{Node: wire.Node(node), Credential: cred, CredentialExpiresAt: timestamppb.New(exp)}), nil
}

func (a *agentService) Spawn(ctx context.Context, req *connect.Request[tetherv1.SpawnRequest]) (*connect.Response[tetherv1.SpawnResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	node, err := a.s.tree.SpawnBy(ctx, req.Msg.ParentNodeId, req.Msg.Name, req.Msg.Labels, asCaller(p), spawnsUnderOwnNode(p))
	if err != nil {
		return nil, toConnect(err)
	}
	// Signed after the child is durable, not beside the commit: a goroutine
	// signing during the commit made a lone caller's spawns slower on a
	// loaded machine (its wake-ups competed with the committer's), and
	// with many callers the CPU, not the wait, is the bound.
	cred, exp, err := a.s.authn.MintAgent(node.NodeID, lineageOf(node), a.s.cfg.Clock.Now(), a.s.cfg.AgentCredentialTTL)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.SpawnResponse{Node: wire.Node(node), Credential: cred, CredentialExpiresAt: timestamppb.New(exp)}), nil
}

// spawnsUnderOwnNode authorises a spawn under parent: an agent spawns only
// under its own node (it cannot grow another agent's subtree); operators
// spawn anywhere.
func spawnsUnderOwnNode(p auth.Principal) func(parent *tree.Node) error {
	return ownNodeOnly(p, "spawn only under its own node", "parent_node_id")
}

// ownNodeOnly is a tree authorize function for an action an agent may
// take on its own node only (operators on any): the agent "may <may>, not
// <field> <node id>".
func ownNodeOnly(p auth.Principal, may, field string) func(*tree.Node) error {
	return func(n *tree.Node) error {
		if p.IsAgent() && n.NodeID != p.NodeID() {
			return fmt.Errorf("%w: agent %s may %s, not %s %s", auth.ErrDenied, p.NodeID(), may, field, n.NodeID)
		}
		return nil
	}
}

// MaxSpawnBatch bounds the children of one SpawnBatch call (one store
// transaction, one response).
const MaxSpawnBatch = 256

// SpawnBatch is Spawn for many children of one parent: one call, one
// transaction (all or none), authorised as Spawn, each child with its own
// credential.
func (a *agentService) SpawnBatch(ctx context.Context, req *connect.Request[tetherv1.SpawnBatchRequest]) (*connect.Response[tetherv1.SpawnBatchResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if n := len(req.Msg.Children); n == 0 || n > MaxSpawnBatch {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("children: %d given; a batch spawns 1 to %d children", n, MaxSpawnBatch))
	}
	// A batch of n costs the caller's rate budget what n Spawn calls do.
	if err := auth.Spend(ctx, len(req.Msg.Children)-1); err != nil {
		return nil, err
	}
	specs := make([]tree.ChildSpec, len(req.Msg.Children))
	for i, c := range req.Msg.Children {
		if err := a.s.tree.ValidateNode(c.Name, c.Labels); err != nil {
			return nil, toConnect(fmt.Errorf("children[%d]: %w", i, err))
		}
		specs[i] = tree.ChildSpec{Name: c.Name, Labels: c.Labels}
	}
	nodes, err := a.s.tree.SpawnManyBy(ctx, req.Msg.ParentNodeId, specs, asCaller(p), spawnsUnderOwnNode(p))
	if err != nil {
		return nil, toConnect(err)
	}
	// The credentials, once the children are durable, signed on every
	// core.
	creds := make([]mintedCredential, len(nodes))
	now := a.s.cfg.Clock.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(nodes)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(nodes); i = int(next.Add(1) - 1) {
				c := &creds[i]
				c.token, c.expires, c.err = a.s.authn.MintAgent(nodes[i].NodeID, lineageOf(nodes[i]), now, a.s.cfg.AgentCredentialTTL)
			}
		})
	}
	wg.Wait()
	out := &tetherv1.SpawnBatchResponse{Spawned: make([]*tetherv1.SpawnResponse, len(nodes))}
	for i, n := range nodes {
		if creds[i].err != nil {
			return nil, toConnect(creds[i].err)
		}
		out.Spawned[i] = &tetherv1.SpawnResponse{Node: wire.Node(n), Credential: creds[i].token, CredentialExpiresAt: timestamppb.New(creds[i].expires)}
	}
	return connect.NewResponse(out), nil
}

// mintedCredential is an agent credential minted for a child of a batch.
type mintedCredential struct {
	token   string
	expires time.Time
	err     error
}

// canSee says whether p may read node n: operators see everything, an agent
// sees its own subtree.
func canSee(p auth.Principal, n *tree.Node) bool {
	return !p.IsAgent() || n.NodeID == p.NodeID() || tree.IsAncestor(n, p.NodeID())
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
		// Answered as a node that does not exist (the store's own
		// not-found), so an agent cannot learn by its id whether a node
		// outside its subtree exists.
		return nil, toConnect(fmt.Errorf("%w: %s", tree.ErrNodeNotFound, n.NodeID))
	}
	return connect.NewResponse(&tetherv1.GetNodeResponse{Node: wire.Node(n)}), nil
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
	if req.Msg.OneLevel {
		return a.listLevel(ctx, p, root, selector, req.Msg)
	}
	if root == "" {
		// A call reads at most maxPageSize nodes, matching or not: a rare
		// selector is answered a page of the nodes it read at a time (with
		// the matches among them and a continuation), each call bounded
		// and a request of the caller's budget, however large a rogue grew
		// its subtree.
		nodes, next, _, err := a.s.tree.List(ctx, selector, req.Msg.PageToken, pageSize(req.Msg.PageSize), maxPageSize)
		if err != nil {
			return nil, toConnect(err)
		}
		return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: wire.Nodes(nodes), NextPageToken: next}), nil
	}
	if err := a.agentMaySee(ctx, p, root); err != nil {
		return nil, err
	}
	if req.Msg.SubtreePages {
		// A page of the subtree, depth first, a call reading at most
		// maxPageSize nodes of it (matching or not) and answering the
		// matches among them with a continuation: a subtree a rogue grew
		// past what one message may carry (about 3,800 nodes with every
		// label allowed exceed the SDKs' 16 MiB) is still listed, a
		// bounded call and a request of the budget at a time.
		nodes, next, _, err := a.s.tree.SubtreePage(ctx, root, selector, req.Msg.PageToken, pageSize(req.Msg.PageSize), maxPageSize)
		if err != nil {
			return nil, toConnect(err)
		}
		return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: wire.Nodes(nodes), NextPageToken: next}), nil
	}
	nodes, err := a.s.tree.Subtree(ctx, root)
	if err != nil {
		return nil, toConnect(err)
	}
	if !canSee(p, nodes[0]) {
		return nil, toConnect(fmt.Errorf("%w: %s", tree.ErrNodeNotFound, root))
	}
	// A subtree is read and answered whole, not in pages: it costs the
	// caller's rate budget a request per page of maxPageSize nodes read, as
	// listing them in pages would, so that one call on a large tree does not
	// buy a hundred pages of work at the price of one. The read is done, so
	// its price is taken even past what the budget has left, and answered
	// (auth.SpendDone).
	auth.SpendDone(ctx, (len(nodes)-1)/maxPageSize)
	out := nodes[:0]
	for _, n := range nodes {
		if tree.MatchLabels(n.Labels, selector) {
			out = append(out, n)
		}
	}
	return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: wire.Nodes(out)}), nil
}

// listLevel answers ListNodes with one_level: a page of root's children
// (the roots when root is empty, for an operator), read from the tree's
// child and root indexes, never a subtree. An agent lists the children of
// its own subtree's nodes only (the parent is checked before a child is
// read). A page costs a request of the caller's budget per thousand nodes
// read past the first thousand, as a subtree's listing does.
func (a *agentService) listLevel(ctx context.Context, p auth.Principal, root string, selector map[string]string, msg *tetherv1.ListNodesRequest) (*connect.Response[tetherv1.ListNodesResponse], error) {
	if err := a.agentMaySee(ctx, p, root); err != nil {
		return nil, err
	}
	lv, read, err := a.s.tree.ListLevel(ctx, root, msg.PageToken, pageSize(msg.PageSize))
	if err != nil {
		return nil, toConnect(err)
	}
	auth.SpendDone(ctx, (read-1)/maxPageSize)
	out := lv.Nodes[:0]
	for _, n := range lv.Nodes {
		if tree.MatchLabels(n.Labels, selector) {
			out = append(out, n)
		}
	}
	// The counts of the nodes answered, and the parent's.
	counts := make(map[string]uint64, len(out)+1)
	for _, id := range append([]string{root}, nodeIDs(out)...) {
		if c, ok := lv.ChildCounts[id]; ok {
			counts[id] = c
		}
	}
	return connect.NewResponse(&tetherv1.ListNodesResponse{Nodes: wire.Nodes(out), NextPageToken: lv.Next, ChildCounts: counts}), nil
}

// agentMaySee refuses an agent a listing rooted outside its own subtree.
// The root is checked before anything below it is read (another tree's
// could be large), and answered as a node that does not exist, so an agent
// cannot learn by its id whether a node outside its subtree exists.
func (a *agentService) agentMaySee(ctx context.Context, p auth.Principal, root string) error {
	if !p.IsAgent() || root == p.NodeID() {
		return nil
	}
	n, err := a.s.tree.Get(ctx, root)
	if err != nil {
		return toConnect(err)
	}
	if !canSee(p, n) {
		return toConnect(fmt.Errorf("%w: %s", tree.ErrNodeNotFound, n.NodeID))
	}
	return nil
}

// pageSize is a listing's page size: the request's, at most maxPageSize,
// maxPageSize when it names none.
func pageSize(asked int32) int {
	if asked == 0 || asked > maxPageSize {
		return maxPageSize
	}
	return int(asked)
}

func nodeIDs(nodes []*tree.Node) []string {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.NodeID
	}
	return ids
}
