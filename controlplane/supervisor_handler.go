package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

type supervisorService struct {
	tetherv1connect.UnimplementedSupervisorServiceHandler
	s *Server
}

// authorizeStop allows operators and the security role, and an agent that
// is a strict ancestor of the target. The target itself and its
// descendants are refused: the transition out of requested is started by an
// authority outside the workload.
func authorizeStop(p auth.Principal) func(*tree.Node) error {
	return func(target *tree.Node) error {
		if !p.IsAgent() {
			return nil
		}
		if p.NodeID() == target.NodeID {
			return fmt.Errorf("%w: an agent cannot terminate itself; propose a stop instead (AgentService.ProposeStop)", auth.ErrDenied)
		}
		if !tree.IsAncestor(target, p.NodeID()) {
			return fmt.Errorf("%w: agent %s is not an ancestor of node_id %s", auth.ErrDenied, p.NodeID(), target.NodeID)
		}
		return nil
	}
}

func durationOr(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.AsDuration()
}

func modeFromProto(m tetherv1.TerminationMode) supervisor.Mode {
	switch m {
	case tetherv1.TerminationMode_TERMINATION_MODE_DRAIN:
		return supervisor.ModeDrain
	case tetherv1.TerminationMode_TERMINATION_MODE_ABORT:
		return supervisor.ModeAbort
	}
	return 0
}

func (h *supervisorService) Terminate(ctx context.Context, req *connect.Request[tetherv1.TerminateRequest]) (*connect.Response[tetherv1.TerminateResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	mode := modeFromProto(m.Mode)
	if m.Mode == tetherv1.TerminationMode_TERMINATION_MODE_UNSPECIFIED {
		mode = supervisor.ModeDrain
	}
	t, err := h.s.supervisor.Terminate(ctx, supervisor.TerminateRequest{
		NodeID:           m.NodeId,
		Mode:             mode,
		DrainWindow:      durationOr(m.DrainWindow, supervisor.DefaultDrainWindow),
		CancelAckTimeout: durationOr(m.CancelAckTimeout, supervisor.DefaultCancelAckTimeout),
		ConfirmTimeout:   durationOr(m.ConfirmTimeout, supervisor.DefaultConfirmTimeout),
		Reason:           m.Reason,
		RequestedBy:      p.ID(),
		Authorize:        authorizeStop(p),
		RequesterNodeID:  p.NodeID(),
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.TerminateResponse{Termination: terminationToProto(t)}), nil
}

// canReadTermination: operators read all; an agent reads terminations of
// its own subtree's ancestors' requests (those it requested).
func canReadTermination(p auth.Principal, t supervisor.Termination) bool {
	return !p.IsAgent() || t.RequestedBy == p.ID()
}

// noTermination answers an agent that asks for a termination it did not
// request exactly as for one that does not exist (the store's own
// not-found), so an agent cannot learn whether another tree's termination
// exists by its id.
func noTermination(id string) error {
	return toConnect(fmt.Errorf("%w: termination_id %s", supervisor.ErrTerminationNotFound, id))
}

func (h *supervisorService) GetTermination(ctx context.Context, req *connect.Request[tetherv1.GetTerminationRequest]) (*connect.Response[tetherv1.GetTerminationResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	t, err := h.s.supervisor.Get(ctx, req.Msg.TerminationId)
	if err != nil {
		return nil, toConnect(err)
	}
	if !canReadTermination(p, t) {
		return nil, noTermination(t.ID)
	}
	return connect.NewResponse(&tetherv1.GetTerminationResponse{Termination: terminationToProto(t)}), nil
}

func (h *supervisorService) WatchTermination(ctx context.Context, req *connect.Request[tetherv1.WatchTerminationRequest], stream *connect.ServerStream[tetherv1.WatchTerminationResponse]) error {
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	closeStream, err := h.s.streamOpened(ctx)
	if err != nil {
		return err
	}
	defer closeStream()
	first := true
	err = h.s.supervisor.Watch(ctx, req.Msg.TerminationId, func(t supervisor.Termination) error {
		if first && !canReadTermination(p, t) {
			return noTermination(t.ID)
		}
		first = false
		return stream.Send(&tetherv1.WatchTerminationResponse{Termination: terminationToProto(t)})
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return toConnect(err)
}

func (h *supervisorService) GetRecord(ctx context.Context, req *connect.Request[tetherv1.GetRecordRequest]) (*connect.Response[tetherv1.GetRecordResponse], error) {
	// A record larger than one message (or page_size) answers in pages,
	// never with a failure; a page token reads only the record it names,
	// under this procedure's authorisation (policy.go).
	rec, next, err := h.s.supervisor.RecordPage(ctx, req.Msg.RecordId, req.Msg.TerminationId, req.Msg.PageToken, int(req.Msg.PageSize))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.GetRecordResponse{Record: wire.Record(rec), NextPageToken: next}), nil
}

func (h *supervisorService) ListRecords(ctx context.Context, req *connect.Request[tetherv1.ListRecordsRequest]) (*connect.Response[tetherv1.ListRecordsResponse], error) {
	size := int(req.Msg.PageSize)
	if size < 0 {
		return nil, invalid("page_size must not be negative")
	}
	if size == 0 || size > 100 {
		size = 100
	}
	f := supervisor.RecordFilter{Requester: supervisor.Requester(req.Msg.RequestedBy)}
	if _, ok := tetherv1.RecordRequester_name[int32(req.Msg.RequestedBy)]; !ok {
		return nil, invalid("requested_by %d is not a requester (operator, agent or rollout)", req.Msg.RequestedBy)
	}
	if tn := req.Msg.TreeNodeId; tn != "" {
		if err := id.Check(id.Node, "tree_node_id", tn); err != nil {
			return nil, invalid("%v", err)
		}
		n, err := h.s.tree.Get(ctx, tn)
		if errors.Is(err, tree.ErrNodeNotFound) {
			return nil, connect.NewError(connect.CodeNotFound, errorf("tree_node_id %s: no such node", tn))
		}
		if err != nil {
			return nil, toConnect(err)
		}
		f.Tree = tree.Root(n)
	}
	recs, next, partial, err := h.s.supervisor.RecordsOf(ctx, f, req.Msg.PageToken, size)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ListRecordsResponse{Records: wire.Records(recs), NextPageToken: next, PartialRecordIds: partial}), nil
}

func (h *supervisorService) DecideProposal(ctx context.Context, req *connect.Request[tetherv1.DecideProposalRequest]) (*connect.Response[tetherv1.DecideProposalResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	prop, term, err := h.s.supervisor.Decide(ctx, req.Msg.ProposalId, req.Msg.Approve, req.Msg.Reason, p.ID())
	if err != nil {
		return nil, toConnect(err)
	}
	resp := &tetherv1.DecideProposalResponse{Proposal: wire.Proposal(prop)}
	if term != nil {
		resp.Termination = terminationToProto(*term)
	}
	return connect.NewResponse(resp), nil
}

func (h *supervisorService) ListProposals(ctx context.Context, req *connect.Request[tetherv1.ListProposalsRequest]) (*connect.Response[tetherv1.ListProposalsResponse], error) {
	if req.Msg.PageSize < 0 {
		return nil, invalid("page_size must not be negative")
	}
	props, next, err := h.s.supervisor.Proposals(ctx, supervisor.ProposalState(req.Msg.State), req.Msg.NodeId, req.Msg.PageToken, int(req.Msg.PageSize))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ListProposalsResponse{Proposals: wire.Proposals(props), NextPageToken: next}), nil
}

func (h *supervisorService) RegisterPrivilege(ctx context.Context, req *connect.Request[tetherv1.RegisterPrivilegeRequest]) (*connect.Response[tetherv1.RegisterPrivilegeResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if p.IsAgent() && m.NodeId != p.NodeID() {
		return nil, denied("agent %s may register privileges only for its own node, not node_id %s", p.NodeID(), m.NodeId)
	}
	if m.ExpiresAt == nil {
		return nil, invalid("expires_at is required")
	}
	if err := h.grantOfNode(ctx, m.GrantId, m.NodeId); err != nil {
		return nil, err
	}
	priv, err := h.s.privileges.Register(ctx, privilege.Privilege{
		NodeID: m.NodeId, GrantID: m.GrantId, Kind: m.Kind, ExternalID: m.ExternalId,
		ExpiresAt: m.ExpiresAt.AsTime(), RevokeURL: m.RevokeUrl, ByOperator: !p.IsAgent(),
		RegisteredBy: p.ID(),
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RegisterPrivilegeResponse{PrivilegeId: priv.ID}), nil
}

// grantOfNode checks that a privilege's grant_id, when given, names a
// grant node holds: the revoke hook is told the privilege was obtained
// under that grant, so a node must not tie its privilege to a grant it was
// never given (another agent's, say). The refusal reads the same whether
// or not the grant exists.
func (h *supervisorService) grantOfNode(ctx context.Context, grantID, nodeID string) error {
	if grantID == "" || h.s.grants == nil {
		return nil
	}
	caller, err := grantCaller(ctx)
	if err != nil {
		return err
	}
	g, err := h.s.grants.Get(ctx, caller, grantID)
	switch {
	case err == nil && g.HolderNodeID == nodeID:
		return nil
	case err == nil, errors.Is(err, capability.ErrUnknownGrant), errors.Is(err, grantstore.ErrNotVisible):
		return denied("grant_id %s is not a grant held by node_id %s; a privilege names only a grant of its own node", grantID, nodeID)
	default:
		return toConnect(err)
	}
}

func terminationToProto(t supervisor.Termination) *tetherv1.Termination {
	// Unconfirmed is set when the mark finishes: until then no exit is
	// counted, and members less an unset count would read as every node
	// marked so far confirmed.
	confirmations := 0
	if t.Phase != supervisor.PhaseRequested {
		confirmations = max(0, t.MemberCount()-t.Progress.Unconfirmed)
	}
	state := tetherv1.TerminationState(tetherv1.TerminationState_value["TERMINATION_STATE_"+strings.ToUpper(t.Phase.String())])
	return &tetherv1.Termination{
		TerminationId:    t.ID,
		NodeId:           t.NodeID,
		Mode:             modeToProto(t.Mode),
		DrainWindow:      durationpb.New(t.DrainWindow),
		CancelAckTimeout: durationpb.New(t.CancelAckTimeout),
		ConfirmTimeout:   durationpb.New(t.ConfirmTimeout),
		Reason:           t.Reason,
		RequestedBy:      t.RequestedBy,
		State:            state,
		RequestedAt:      timestamppb.New(t.RequestedAt),
		UpdatedAt:        timestamppb.New(t.UpdatedAt),
		Progress: &tetherv1.TerminationProgress{
			NodesTotal:    uint32(t.MemberCount()),
			NodesMarked:   uint32(t.MemberCount()),
			CallsInFlight: uint32(t.Progress.CallsInFlight),
			AcksPending:   uint32(t.Progress.CancelsPending),
			Confirmations: uint32(confirmations),
		},
		RecordId:     t.RecordID,
		Escalated:    t.Escalated,
		RootNodeIds:  t.Roots,
		RolloutId:    t.RolloutID,
		TookOverFrom: t.TookOverFromIDs(),
		SupersededBy: t.SupersededByIDs(),
	}
}

// handoffTerminations are the distinct other terminations, in order.
func modeToProto(m supervisor.Mode) tetherv1.TerminationMode {
	if m == supervisor.ModeAbort {
		return tetherv1.TerminationMode_TERMINATION_MODE_ABORT
	}
	return tetherv1.TerminationMode_TERMINATION_MODE_DRAIN
}

// ListPrivileges lists a node's registered privileges, without their
// revoke_url (operators only: the policy's rule).
func (h *supervisorService) ListPrivileges(ctx context.Context, req *connect.Request[tetherv1.ListPrivilegesRequest]) (*connect.Response[tetherv1.ListPrivilegesResponse], error) {
	if _, err := h.s.tree.Get(ctx, req.Msg.NodeId); err != nil {
		return nil, toConnect(err)
	}
	privs, err := store.Read(ctx, h.s.store, func(tx store.ReadTxn) ([]privilege.Privilege, error) {
		return privilege.PrivilegesIn(tx, []string{req.Msg.NodeId})
	})
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.Privilege, 0, len(privs))
	for _, p := range privs {
		pp := &tetherv1.Privilege{
			PrivilegeId: p.ID, NodeId: p.NodeID, GrantId: p.GrantID, Kind: p.Kind, ExternalId: p.ExternalID,
			ExpiresAt: timestamppb.New(p.ExpiresAt), Revoker: "handler", Error: p.Error,
		}
		if p.RevokeURL != "" {
			pp.Revoker = "webhook"
		}
		switch p.Outcome {
		case privilege.OutcomeRevoked:
			pp.Outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED
		case privilege.OutcomeExpired:
			pp.Outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_EXPIRED
		case privilege.OutcomeRevokeFailed:
			pp.Outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED
		}
		if !p.DecidedAt.IsZero() {
			pp.DecidedAt = timestamppb.New(p.DecidedAt)
		}
		out = append(out, pp)
	}
	return connect.NewResponse(&tetherv1.ListPrivilegesResponse{Privileges: out}), nil
}
