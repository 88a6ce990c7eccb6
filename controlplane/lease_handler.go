package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// leaseService is LeaseService: authentication, holder binding and
// authorisation here; judgement, persistence and time in the coordinator.
//
// One rule for bad input, unary and stream alike: a malformed request
// (missing or oversized field, zero or negative duration, bad enum) is
// refused with InvalidArgument naming the field and is never judged; a
// well-formed message the protocol refuses (unknown lease, wrong holder,
// stale or future generation, expired lease, …) is judged and answered
// with a REJECTED decision, recorded in the evidence, leaving the lease's
// authority as it was.
type leaseService struct {
	tetherv1connect.UnimplementedLeaseServiceHandler
	s *Server
}

// leaseHandlerOptions tune LeaseService for its rate: an answer is a few
// hundred bytes and a packed Channel message at most maxAnswersPerMessage
// of them, and gzip on each (connect's default for clients that accept it)
// cost more CPU than judging and persisting them (measured: a fifth of
// the server's CPU). Large evidence matrices and lists are still
// compressed.
var leaseHandlerOptions = []connect.HandlerOption{connect.WithCompressMinBytes(64 << 10)}

// maxChannelInFlight bounds the messages one Channel stream may have
// judged but not yet answered; the stream stops reading beyond it.
const maxChannelInFlight = 4096

func (h *leaseService) leases() *coordinator.Coordinator { return h.s.leases }

// worker judges a worker message from the authenticated agent. The agent
// must be a party to the job (its holder, or a former holder whose late
// traffic is stale evidence) or belong to the lineage that coordinates it
// (see mayCoordinate); anyone else is refused with PermissionDenied before
// the lease machine sees the message: no judgement, no ownership conflict,
// no evidence row, and the same answer whether or not the job exists.
func worker[Resp any](ctx context.Context, h *leaseService, build func(holder string) (lease.Message, error), wrap func(*tetherv1.Lease, *tetherv1.Decision) *Resp) (*connect.Response[Resp], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if !p.IsAgent() {
		// Holder binding: the holder identity is the authenticated agent's
		// node id, so only an agent can speak for a lease it holds.
		return nil, denied("%s is not an agent: only the holder agent sends worker messages, with its own credential", p.ID())
	}
	m, err := build(p.NodeID())
	if err != nil {
		return nil, toConnect(err)
	}
	m = signed(m, p.ID())
	if _, isAck := m.(lease.Ack); isAck {
		if err := h.takesWork(ctx, p.NodeID(), "acknowledge"); err != nil {
			return nil, err
		}
	}
	res, err := h.leases().ApplyIf(ctx, m, partyGuard(p.NodeID(), m))
	switch {
	case errors.Is(err, errNoLease):
		return nil, noLease(m.Job())
	case errors.Is(err, errNotParty):
		res, err = h.judgeForLineage(ctx, p, m)
	default:
		res = forParty(p.NodeID(), m, res)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(wrap(wire.Lease(res.Lease), wire.Decision(res.Decision))), nil
}

// Outcomes of partyGuard: the job has no lease, or the caller is neither
// its holder nor a former holder. Neither is judged.
var (
	errNoLease   = errors.New("controlplane: no lease for the job")
	errNotParty  = errors.New("controlplane: not a party to the job")
	errJobExists = errors.New("controlplane: the job already has a lease")
)

// partyGuard admits, on the job's shard and against the lease the message
// is judged with, the parties to the job (lease.Lease.Party): its holder,
// with one string comparison, so the renew hot path reads nothing; and a
// former holder speaking about an earlier generation. Anyone else needs
// the lineage check (judgeForLineage), which reads the tree.
func partyGuard(caller string, m lease.Message) func(lease.Lease) error {
	claim, _ := lease.ClaimOf(m)
	return func(l lease.Lease) error {
		switch {
		case !l.Exists():
			return errNoLease
		case l.Party(caller, claim.Generation):
			return nil
		}
		return errNotParty
	}
}

// forParty is the answer to a party's judged message m. The holder sees
// its lease. A former holder (its late traffic is judged as stale
// evidence) may read nothing of the generation that replaced its own —
// GetLease and Evidence refuse it — so its answer says only that it was
// fenced off (lease.ForFormerHolder): the job, the current generation and
// its state, and a reason built from its own message and those alone. The
// evidence row keeps everything.
func forParty(caller string, m lease.Message, r coordinator.Result) coordinator.Result {
	if !r.Lease.Exists() || r.Lease.HolderIdentity == caller {
		return r
	}
	r.Lease, r.Decision = lease.ForFormerHolder(r.Lease, m, r.Decision)
	return r
}

// noLease is the one answer a caller gets for a job it may not touch,
// whether or not the job exists: it names nothing the caller did not send.
func noLease(job string) error {
	return denied("job %q: there is no lease you may act on (no such job, or it is neither held by you nor coordinated by your lineage)", job)
}

// judgeForLineage judges a worker message from an agent that is not a
// party to the job, if the agent may coordinate it (mayCoordinate); its
// claim then reaches the lease machine, where claiming the active
// generation is an ownership conflict. The check reads the tree, so it is
// re-asserted on the shard: the holder and owner must still be the ones
// checked. Such a claim is a coordinator's decision (a conflict halts the
// holder's work as a cancel does), so an agent that is not running — being
// stopped, stopped or exited — is refused it (tree.MayDecide), as it is a
// cancel or a resolution: the stopping workload does not halt the jobs its
// lineage coordinates, which may be held by agents no termination stops.
func (h *leaseService) judgeForLineage(ctx context.Context, p auth.Principal, m lease.Message) (coordinator.Result, error) {
	job := m.Job()
	running := false
	for attempt := 0; ; attempt++ {
		current, err := h.leases().Get(ctx, job)
		if errors.Is(err, coordinator.ErrNotFound) {
			return coordinator.Result{}, noLease(job)
		}
		if err != nil {
			return coordinator.Result{}, err
		}
		ok, err := h.mayCoordinate(ctx, p, current)
		if err != nil {
			return coordinator.Result{}, err
		}
		if !ok {
			return coordinator.Result{}, noLease(job)
		}
		if !running {
			if err := h.decides(ctx, p, tree.DecideClaim); err != nil {
				return coordinator.Result{}, err
			}
			running = true
		}
		res, err := h.leases().ApplyIf(ctx, m, sameParties(current))
		if errors.Is(err, coordinator.ErrPrecondition) && attempt < 3 {
			continue
		}
		if errors.Is(err, errNoLease) {
			return coordinator.Result{}, noLease(job)
		}
		return res, err
	}
}

// sameParties refuses the judgement when the job's holder or owner changed
// since checked was read.
func sameParties(checked lease.Lease) func(lease.Lease) error {
	return func(l lease.Lease) error {
		switch {
		case !l.Exists():
			return errNoLease
		case l.HolderIdentity != checked.HolderIdentity || l.Owner != checked.Owner:
			return fmt.Errorf("%w: job %q changed hands while the request was checked; retry", coordinator.ErrPrecondition, checked.JobID)
		}
		return nil
	}
}

// takesWork refuses a new lease (an offer or reassignment to the node, or
// its ACK) when the node is not running: a node that is draining, aborting
// or stopped must not start new work.
func (h *leaseService) takesWork(ctx context.Context, nodeID, what string) error {
	_, err := h.runningNode(ctx, nodeID, what)
	return err
}

// runningNode is takesWork returning the node.
func (h *leaseService) runningNode(ctx context.Context, nodeID, what string) (*tree.Node, error) {
	n, cover, err := h.s.tree.GetUnder(ctx, nodeID)
	if errors.Is(err, tree.ErrNodeNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("holder_identity %s is not a registered agent", nodeID))
	}
	if err != nil {
		return nil, toConnect(err)
	}
	if n.State != tree.NodeStateRunning {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("agent %s is %s: a node that is draining, aborting or stopped cannot %s a new lease", nodeID, tree.StateName(n.State), what))
	}
	if cover != nil {
		// A termination covers it; its mark, top down, has not reached it.
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("%s: a node that is draining, aborting or stopped, or that a stop covers, cannot %s a new lease", cover.Describe(nodeID), what))
	}
	return n, nil
}

func (h *leaseService) Ack(ctx context.Context, req *connect.Request[tetherv1.AckRequest]) (*connect.Response[tetherv1.AckResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return wire.AckMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.AckResponse {
			return &tetherv1.AckResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Renew(ctx context.Context, req *connect.Request[tetherv1.RenewRequest]) (*connect.Response[tetherv1.RenewResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return wire.RenewMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.RenewResponse {
			return &tetherv1.RenewResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Progress(ctx context.Context, req *connect.Request[tetherv1.ProgressRequest]) (*connect.Response[tetherv1.ProgressResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return wire.ProgressMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.ProgressResponse {
			return &tetherv1.ProgressResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) CancelAck(ctx context.Context, req *connect.Request[tetherv1.LeaseServiceCancelAckRequest]) (*connect.Response[tetherv1.LeaseServiceCancelAckResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return wire.CancelAckMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.LeaseServiceCancelAckResponse {
			return &tetherv1.LeaseServiceCancelAckResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Complete(ctx context.Context, req *connect.Request[tetherv1.CompleteRequest]) (*connect.Response[tetherv1.CompleteResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return wire.CompleteMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.CompleteResponse {
			return &tetherv1.CompleteResponse{Lease: l, Decision: d}
		})
}

// The lineage that coordinates a job: operators; the agent that offered it
// (Lease.Owner) and that agent's ancestors, while the job's holder is an
// agent of the owner's tree and they are not below it; and the ancestors
// of its current holder (never the holder itself, a sibling or a
// descendant: an owner below the holder, its job moved up the tree, is a
// stranger to it). It may read the
// job, request its cancellation, reassign and resolve it, and send worker
// messages for it (a claim on the active generation from anyone but the
// holder is then an ownership conflict). When an operator (or a rollout's
// handover to a replacement tree) moves the job to an agent of another
// tree, coordination passes with it: to the operators and the new holder's
// ancestors, as for a job an operator offered; the owner's tree is a
// stranger to the job from then on (Owner still records who offered it).
// A holder reads its own lease and the evidence rows of its tree
// (treeRows); a former holder's worker messages are judged (as stale) but
// it reads nothing else. Every other agent is a stranger to the job.

// mayDirect reports whether p may direct leases held by holder: operators
// may, and so may an agent that is an ancestor of holder in the agent
// tree (never the holder itself, nor a sibling or descendant).
func (h *leaseService) mayDirect(ctx context.Context, p auth.Principal, holder, field string) error {
	if !p.IsAgent() {
		return nil
	}
	ok, err := h.isAncestor(ctx, p.NodeID(), holder)
	if err != nil {
		return err
	}
	if !ok {
		return denied("agent %s may direct only leases held by its descendants, and %s %s is not one", p.NodeID(), field, holder)
	}
	return nil
}

// isAncestor reports whether agent is an ancestor of node (false when node
// is not a registered agent).
func (h *leaseService) isAncestor(ctx context.Context, agent, node string) (bool, error) {
	n, err := h.agent(ctx, node)
	if n == nil || err != nil {
		return false, err
	}
	return tree.IsAncestor(n, agent), nil
}

// agent reads a registered agent's node; nil when id names none.
func (h *leaseService) agent(ctx context.Context, id string) (*tree.Node, error) {
	if id == "" {
		return nil, nil
	}
	n, err := h.s.tree.Get(ctx, id)
	if errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument) {
		return nil, nil
	}
	return n, err
}

// mayCoordinate reports whether p belongs to the lineage that coordinates
// the job l (see above).
func (h *leaseService) mayCoordinate(ctx context.Context, p auth.Principal, l lease.Lease) (bool, error) {
	if !p.IsAgent() {
		return true, nil
	}
	caller := p.NodeID()
	if caller == l.HolderIdentity {
		return false, nil
	}
	holder, err := h.agent(ctx, l.HolderIdentity)
	if holder == nil || err != nil {
		return false, err
	}
	if tree.IsAncestor(holder, caller) {
		return true, nil
	}
	// The owner's lineage, while the job is in the owner's tree: the
	// caller's, if it is the owner or one of its ancestors.
	if l.Owner == "" {
		return false, nil
	}
	if root, err := h.lineage(ctx, p); root != tree.Root(holder) || err != nil {
		return false, err
	}
	// Never below the holder: the job may have moved up the owner's tree
	// (an ancestor of the holder reassigned it to one of the owner's
	// ancestors), and a holder's descendants — the owner among them — do
	// not cancel, resolve, claim, reassign or read their ancestor's work.
	if n, err := h.agent(ctx, caller); n == nil || err != nil || tree.IsAncestor(n, l.HolderIdentity) {
		return false, err
	}
	if caller == l.Owner {
		return true, nil
	}
	return h.isAncestor(ctx, caller, l.Owner)
}

// lineage is the root of an agent's tree: the principal's, as the
// interceptor read it from the agent's node, or the node's.
func (h *leaseService) lineage(ctx context.Context, p auth.Principal) (string, error) {
	if p.Lineage != "" {
		return p.Lineage, nil
	}
	n, err := h.agent(ctx, p.NodeID())
	if n == nil || err != nil {
		return "", err
	}
	return tree.Root(n), nil
}

// coordinate judges a coordinator message about an existing job: the
// caller must belong to the job's coordinating lineage (and may name as
// newHolder only a running agent it may direct). A stranger gets noLease
// whether or not the job exists, and nothing is judged or recorded. The
// check is made against the durable lease and re-asserted on the shard
// (holder and owner must still be the ones checked), so a concurrent
// reassignment cannot slip in between.
func (h *leaseService) coordinate(ctx context.Context, job, decision string, build func(current lease.Lease) (lease.Message, error), newHolder string) (coordinator.Result, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return coordinator.Result{}, err
	}
	if err := wire.CheckID("job_id", job); err != nil {
		return coordinator.Result{}, err
	}
	if err := h.decides(ctx, p, decision); err != nil {
		return coordinator.Result{}, err
	}
	for attempt := 0; ; attempt++ {
		current, err := h.leases().Get(ctx, job)
		if err != nil && !errors.Is(err, coordinator.ErrNotFound) {
			return coordinator.Result{}, err
		}
		if p.IsAgent() {
			ok := false
			if current.Exists() {
				if ok, err = h.mayCoordinate(ctx, p, current); err != nil {
					return coordinator.Result{}, err
				}
			}
			if !ok {
				return coordinator.Result{}, noLease(job)
			}
		}
		lineage := ""
		if newHolder != "" {
			if lineage, err = h.checkHolder(ctx, p, newHolder); err != nil {
				return coordinator.Result{}, err
			}
		}
		m, err := build(current)
		if err != nil {
			return coordinator.Result{}, err
		}
		m = signed(m, p.ID())
		guard := func(l lease.Lease) error {
			if l.Exists() != current.Exists() || l.HolderIdentity != current.HolderIdentity || l.Owner != current.Owner {
				return fmt.Errorf("%w: job %q changed holder while the request was checked; retry", coordinator.ErrPrecondition, job)
			}
			return nil
		}
		var res coordinator.Result
		if newHolder != "" {
			// A reassignment gives the new holder an open lease: within
			// the bounds, as an offer.
			res, err = h.applyBounded(ctx, p, m, guard, lineage)
		} else {
			res, err = h.leases().ApplyIf(ctx, m, guard)
		}
		if errors.Is(err, coordinator.ErrPrecondition) && attempt < 3 {
			continue
		}
		return res, err
	}
}

// signed begins a coordinator message's reason, and a Complete's detail,
// with the principal that sent it, so that the evidence row and the job's
// terminal detail say who cancelled, reassigned, resolved or completed
// the job: the coordinating lineage and the holder are agents, whose free
// text must not read as an operator's word or as the control plane's own
// (the reasons it writes when a termination finalises a lease begin with
// no principal). The signed text is cut to the message limit on a
// character boundary.
func signed(m lease.Message, who string) lease.Message {
	sign := func(reason string) string {
		if reason == "" {
			return who
		}
		s := who + ": " + reason
		if len(s) <= lease.MaxValueBytes {
			return s
		}
		n := lease.MaxValueBytes
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return s[:n]
	}
	switch v := m.(type) {
	case lease.RequestCancel:
		v.Reason = sign(v.Reason)
		return v
	case lease.Reassign:
		v.Reason = sign(v.Reason)
		return v
	case lease.Resolve:
		v.Reason = sign(v.Reason)
		return v
	case lease.Complete:
		v.Detail = sign(v.Detail)
		return v
	}
	return m
}

// decides refuses a coordinator's decision (tree.MayDecide) from an agent
// that is not running: an agent being stopped, stopped or exited does not
// offer, reassign, cancel or resolve the jobs its lineage coordinates —
// its word that a job ended would be the stopped workload writing its own
// record. It reads the caller's node before the job, so the refusal says
// nothing of the job; the lease and its evidence are left as they were.
// (The node is read before the judgement: a decision in flight as a
// termination marks the caller may still be judged, design §11.)
func (h *leaseService) decides(ctx context.Context, p auth.Principal, decision string) error {
	if !p.IsAgent() {
		return nil
	}
	n, cover, err := h.s.tree.GetUnder(ctx, p.NodeID())
	if err != nil {
		return toConnect(err)
	}
	return toConnect(tree.MayDecideUnder(n, cover, decision))
}

// checkHolder checks that a holder named in an Offer or Reassign is a
// registered agent the caller may direct, and that it is running: a node
// that is draining, aborting or stopped is offered nothing new. It
// returns the holder's lineage (the root of its tree), under which its
// open leases are bounded.
func (h *leaseService) checkHolder(ctx context.Context, p auth.Principal, holder string) (string, error) {
	if err := id.Check(id.Node, "holder_identity", holder); err != nil {
		return "", invalid("%v", err)
	}
	if p.IsAgent() {
		if err := h.mayDirect(ctx, p, holder, "holder_identity"); err != nil {
			return "", err
		}
	}
	n, err := h.runningNode(ctx, holder, "be offered")
	if err != nil {
		return "", err
	}
	return tree.Root(n), nil
}

// Offer starts a job's lease. The offering agent (none for an operator) is
// recorded as the job's owner. Job ids are one namespace: an agent offering
// a job id that already has a lease is refused with PermissionDenied unless
// it belongs to the job's coordinating lineage, and learns nothing of that
// lease (only that the id is taken).
func (h *leaseService) Offer(ctx context.Context, req *connect.Request[tetherv1.OfferRequest]) (*connect.Response[tetherv1.OfferResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	m, err := wire.OfferMessage(req.Msg, id.New(id.Lease), h.leases().Policy())
	if err != nil {
		return nil, toConnect(err)
	}
	if err := h.decides(ctx, p, tree.DecideOffer); err != nil {
		return nil, err
	}
	lineage, err := h.checkHolder(ctx, p, req.Msg.HolderIdentity)
	if err != nil {
		return nil, toConnect(err)
	}
	var guard func(lease.Lease) error
	if p.IsAgent() {
		offer := m.(lease.Offer)
		offer.Owner = p.NodeID()
		m = offer
		guard = func(l lease.Lease) error {
			if l.Exists() {
				return errJobExists
			}
			return nil
		}
	}
	// Within the bounds on open leases (Config.LeaseMaxOpenPerHolder,
	// LeaseMaxOpenPerLineage): past them refused resource_exhausted,
	// unjudged.
	res, err := h.applyBounded(ctx, p, m, guard, lineage)
	if errors.Is(err, errJobExists) {
		// Judged (and answered with the lease) only for its lineage.
		current, getErr := h.leases().Get(ctx, req.Msg.JobId)
		ok := false
		if getErr == nil {
			ok, getErr = h.mayCoordinate(ctx, p, current)
		}
		if getErr != nil && !errors.Is(getErr, coordinator.ErrNotFound) {
			return nil, toConnect(getErr)
		}
		if !ok {
			return nil, denied("job id %q is already in use outside your lineage; choose another job id", req.Msg.JobId)
		}
		res, err = h.applyBounded(ctx, p, m, sameParties(current), lineage)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.OfferResponse{Lease: wire.Lease(res.Lease), Decision: wire.Decision(res.Decision)}), nil
}

func (h *leaseService) Reassign(ctx context.Context, req *connect.Request[tetherv1.ReassignRequest]) (*connect.Response[tetherv1.ReassignResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, tree.DecideReassign, func(current lease.Lease) (lease.Message, error) {
		return wire.ReassignMessage(req.Msg, id.New(id.Lease), current, h.leases().Policy())
	}, req.Msg.HolderIdentity)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ReassignResponse{Lease: wire.Lease(res.Lease), Decision: wire.Decision(res.Decision)}), nil
}

func (h *leaseService) RequestCancel(ctx context.Context, req *connect.Request[tetherv1.RequestCancelRequest]) (*connect.Response[tetherv1.RequestCancelResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, tree.DecideRequestCancel, func(lease.Lease) (lease.Message, error) {
		return wire.RequestCancelMessage(req.Msg)
	}, "")
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RequestCancelResponse{Lease: wire.Lease(res.Lease), Decision: wire.Decision(res.Decision)}), nil
}

func (h *leaseService) Resolve(ctx context.Context, req *connect.Request[tetherv1.ResolveRequest]) (*connect.Response[tetherv1.ResolveResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, tree.DecideResolve, func(lease.Lease) (lease.Message, error) {
		return wire.ResolveMessage(req.Msg, h.leases().Policy())
	}, "")
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ResolveResponse{Lease: wire.Lease(res.Lease), Decision: wire.Decision(res.Decision)}), nil
}

// mayRead reports whether p may read leases held by holder: operators of
// any role, the holder itself and its ancestors.
func (h *leaseService) mayRead(ctx context.Context, p auth.Principal, holder string) error {
	if !p.IsAgent() || holder == p.NodeID() {
		return nil
	}
	return h.mayDirect(ctx, p, holder, "the holder")
}

// readable returns the job's lease if p may read it: operators, its holder
// and its coordinating lineage. An agent gets noLease for a job it may not
// read and for a job that does not exist alike.
func (h *leaseService) readable(ctx context.Context, p auth.Principal, job string) (lease.Lease, error) {
	if err := wire.CheckID("job_id", job); err != nil {
		return lease.Lease{}, toConnect(err)
	}
	l, err := h.settledGet(ctx, p, job)
	if !p.IsAgent() {
		return l, toConnect(err)
	}
	if errors.Is(err, coordinator.ErrNotFound) {
		return lease.Lease{}, noLease(job)
	}
	if err != nil {
		return lease.Lease{}, toConnect(err)
	}
	if l.HolderIdentity == p.NodeID() {
		return l, nil
	}
	ok, err := h.mayCoordinate(ctx, p, l)
	if err != nil {
		return lease.Lease{}, toConnect(err)
	}
	if !ok {
		return lease.Lease{}, noLease(job)
	}
	return l, nil
}

// settledGet is the coordinator's Get, never answering a lease as if a
// deadline the declared clock has passed were still ahead. A serving
// coordinator's shard judges the deadlines the clock has passed before it
// answers (a settled read). Any other read is of the store as the last
// run left it: on a replica that does not lead, between runs, in a
// restarted control plane before its coordinator serves — a quiet
// holder's lease read ACTIVE past the expiry that passed meanwhile — and
// on a leader deposed between its check of whether it serves and its read
// (the run stopped in between). Such a read, when lease.Due says the
// clock passed one of its deadlines, is not answered as it is: a control
// plane alone on its store (Badger) is its own leader, and waits for its
// coordinator to serve (its recovery decides the deadlines that fell
// while it was down) and reads again; a replica among several (etcd)
// answers coordinator.ErrStopped, on which the forwarder sends the read
// to the leader (forward.go) — but to a tool server, whose reads forFence
// answers (an ACTIVE lease past its expiry reads EXPIRED), it answers the
// read. Whether the coordinator served is the read's own answer, not a
// check before or after it, so neither a coordinator that began serving
// nor one that stopped serving around the read is mistaken for the other
// (TestRogue29DBALeaderThatLosesItsLeadershipBeforeItsReadShowsWhatTheClockDecided).
func (h *leaseService) settledGet(ctx context.Context, p auth.Principal, job string) (lease.Lease, error) {
	if beforeLeaseRead != nil {
		beforeLeaseRead(h.leases())
	}
	l, settled, err := h.leases().GetSettled(ctx, job)
	if afterLeaseRead != nil {
		afterLeaseRead(h.leases())
	}
	if err != nil || settled || !lease.Due(l, h.s.cfg.Clock.Now()) {
		return l, err
	}
	if h.s.router != nil {
		if p.IsToolServer() {
			return l, nil
		}
		return lease.Lease{}, fmt.Errorf("%w: job %q has a deadline the clock has passed and this replica's coordinator does not serve: the leader decides it", coordinator.ErrStopped, job)
	}
	if err := h.awaitServing(ctx); err != nil {
		return lease.Lease{}, err
	}
	return h.leases().Get(ctx, job)
}

// afterLeaseRead, set by tests only, runs between settledGet's read and
// its judgement of that read (a coordinator starting to serve in between).
var afterLeaseRead func(leases *coordinator.Coordinator)

// beforeLeaseRead, set by tests only, runs in settledGet before its read:
// after the forwarder found this replica serving (a leader losing its
// leadership in between).
var beforeLeaseRead func(leases *coordinator.Coordinator)

// unserved is asked before a read of the store (ListLeases) and returns
// whether any of the leases that read returns has a deadline the declared
// clock has passed while this control plane, alone on its store, did not
// serve yet when the read began. (settledGet asks the read itself.) Whether it serves is taken before the
// read: a coordinator that starts serving between the read and the check
// has decided those deadlines after the read saw them, and the read's
// answer is stale all the same.
func (h *leaseService) unserved() func(leases ...lease.Lease) bool {
	if h.s.router != nil {
		return func(...lease.Lease) bool { return false } // the forwarder sends such reads to the leader
	}
	if serving, _ := h.leases().Serving(); serving {
		return func(...lease.Lease) bool { return false }
	}
	return func(leases ...lease.Lease) bool {
		now := h.s.cfg.Clock.Now()
		for _, l := range leases {
			if lease.Due(l, now) {
				return true
			}
		}
		return false
	}
}

// awaitServing waits, at most routeWait, for this control plane's
// coordinator to serve; unavailable if it does not.
func (h *leaseService) awaitServing(ctx context.Context) error {
	timeout := time.NewTimer(routeWait)
	defer timeout.Stop()
	for {
		serving, changed := h.leases().Serving()
		if serving {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return toConnect(ctx.Err())
		case <-timeout.C:
			return connect.NewError(connect.CodeUnavailable, errors.New("the job-lease coordinator is starting and the lease's deadline has passed: retry"))
		}
	}
}

func (h *leaseService) GetLease(ctx context.Context, req *connect.Request[tetherv1.GetLeaseRequest]) (*connect.Response[tetherv1.GetLeaseResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.CallId != "" && !p.IsToolServer() {
		return nil, denied("only a tool server names the tool call a read is about (call_id)")
	}
	l, err := h.readable(ctx, p, req.Msg.JobId)
	generation := req.Msg.LeaseGeneration
	// The node whose tool call asked, when the fence named the call (a
	// ToolGate's, which this tool server began): read from the ledger, not
	// from anyone's word.
	caller, callOpen := "", false
	if err == nil && req.Msg.CallId != "" {
		caller, callOpen, err = h.callerOf(ctx, p, req.Msg.CallId)
	}
	// A read naming a generation is a fence's question about a side effect
	// under it: when that is the job's current generation and it would
	// admit it, the holder is weighed. A tool server's read gates a side
	// effect, the holder's activity as its tool sees it (fencedByExit);
	// anyone else's (an agent's, an operator's) gates none and is answered
	// from the holder's node as it reads (holderGone), written nowhere:
	// a rogue owner or ancestor of the job could otherwise make its
	// honest holder's confirmed exit read unaccounted by reading (rogue36c
	// test). A tool server's read naming the call that asks is the
	// holder's activity only when the call is the holder's: another
	// agent's call under the holder's generation is refused all the same
	// (holderGone) but is not the holder at work (thirty-seventh pass: a
	// stranger calling a fenced tool with an exited holder's job and
	// generation made the holder's record read unaccounted; rogue37c test).
	//
	// A call that is neither the holder's nor one of its descendants' has
	// no authority under the holder's lease at all: it is refused
	// (not_holders_call), whoever holds the job (thirty-seventh pass: the
	// fence judged headers, not callers, and a stranger with a token for
	// the tool wrote as the holder by naming its job and generation;
	// rogue37c test).
	exited, notHolders := false, false
	if err == nil && generation != 0 {
		if p.IsToolServer() {
			if admitsFenced(forFence(l, h.s.cfg.Clock.Now()), generation) {
				switch {
				case caller == "" || caller == l.HolderIdentity:
					exited, err = h.fencedByExit(ctx, p, l, req.Msg.CallId)
				default:
					if notHolders, err = h.notHoldersCall(ctx, caller, l.HolderIdentity); err == nil && !notHolders {
						exited, err = h.holderGone(ctx, l.HolderIdentity)
					}
				}
			} else if callOpen && generation < l.Generation && l.Party(caller, generation) {
				err = h.supersededByParty(ctx, p, l, caller, generation, req.Msg.CallId)
			}
		} else if admitsFenced(l, generation) {
			exited, err = h.holderGone(ctx, l.HolderIdentity)
		}
	}
	if p.IsToolServer() {
		if err == nil {
			l = forFence(l, h.s.cfg.Clock.Now())
			if exited || notHolders {
				// No authority to end: a fence that does not know
				// holder_exited (not_holders_call) refuses a generation
				// without an expiry.
				l.ExpiresAt = time.Time{}
			}
		}
		// A fence asks about side effects its callers claim: charged to
		// that job's reads at this tool server only when the answer admits
		// the generation the fence named (the job's current one, which may
		// act), and otherwise — a generation never issued or superseded,
		// one without authority, one whose holder exited, a job that does
		// not exist — to the tool server's refusals. A rogue caller naming
		// jobs and generations spends neither the tool server's own budget
		// nor the reads the job's real holder needs (rogue16lease test). A
		// read that names no generation is charged to the job's, as it
		// always was.
		charge := auth.ChargeRefused // no such job, a malformed id
		if err == nil && !exited && !notHolders && admitsFenced(l, generation) {
			charge = func(ctx context.Context) error { return auth.ChargeJob(ctx, req.Msg.JobId) }
		}
		if cerr := charge(ctx); cerr != nil {
			return nil, cerr
		}
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tetherv1.GetLeaseResponse{Lease: wire.Lease(l), HolderExited: exited, NotHoldersCall: notHolders}), nil
}

// notHoldersCall reports whether caller, the node of a tool call a fence
// named, has no authority under holder's lease: it is neither holder nor
// one of holder's descendants (whom the holder may have handed part of its
// job), or not a registered agent.
func (h *leaseService) notHoldersCall(ctx context.Context, caller, holder string) (bool, error) {
	n, err := h.agent(ctx, caller)
	if err != nil {
		return false, toConnect(err)
	}
	return n == nil || !slices.Contains(n.Ancestors, holder), nil
}

// fencedByExit weighs the holder of l's current generation for a read
// that would admit a side effect under it (a fence's, naming it): whether
// the holder may no longer act — its exit was confirmed, or it was
// terminated — so the side effect is to be refused. The question is the
// holder's activity as its tool sees it: a side effect under its
// generation after its confirmed exit is kept on the node as a tool call
// contradicting the exit (tree.Act, as the gate keeps a call with its
// token), naming who asked, and one after its session's end is the node
// seen alive then; either way its record does not read a confirmed exit
// the side effect contradicts (thirty-fifth pass, rogue35a test). Until
// then an exited holder's ACTIVE generation admitted fenced side effects
// until its expiry or its stop, and its record read CONFIRMED. Only a
// tool server's read is weighed so (thirty-sixth pass: an agent's or an
// operator's read gates no side effect, holderGone). The fence's question
// names a job and a generation; who asked the tool server for the side
// effect only when the fence names the gate's call (call_id, the
// thirty-seventh pass), and then a call of another agent is not weighed
// here. A fence that names no call (no ToolGate in front of it, or an SDK
// older than the field) leaves it unknown: whoever holds the two and
// reaches such a tool server can so make the holder's exit read
// unaccounted, never confirmed — the safe way (design §11).
func (h *leaseService) fencedByExit(ctx context.Context, p auth.Principal, l lease.Lease, callID string) (bool, error) {
	detail := fmt.Sprintf("a side effect under job %q generation %d, asked about by %s", l.JobID, l.Generation, p.ID())
	if callID != "" {
		detail += fmt.Sprintf(" for its call %q", callID)
	}
	_, err := h.s.agentAct(ctx, l.HolderIdentity, tree.ActivityToolCall, detail)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, tree.ErrNodeExited), errors.Is(err, auth.ErrRevoked):
		return true, nil
	}
	return false, toConnect(err)
}

// supersededByParty keeps a side effect under a superseded generation of
// l's job on caller, the node of the gate's call that attempted it (read
// from the ledger: its own call, so it frames nobody), when caller is a
// party to the job (l.Party: its holder, or a former holder): its
// activity as its tool saw it, a tool call contradicting its exit if its
// exit was confirmed (thirty-eighth pass). The fence refuses the side
// effect all the same; until then a former holder's call writing after
// its exit under its old generation was refused without a word to the
// control plane, and its record read CONFIRMED. A read naming no call
// (an ungated fence) is not weighed: anyone naming the job and an old
// generation would frame its former holders (design §11); nor one naming a
// call that has ended, which attempts no side effect: a tool server naming
// its gate's old call of an honest agent framed it after its exit
// (TestRogue38CAToolServerCannotFrameAFormerHolderWithAnEndedCall).
func (h *leaseService) supersededByParty(ctx context.Context, p auth.Principal, l lease.Lease, caller string, generation uint64, callID string) error {
	detail := fmt.Sprintf("a side effect under job %q generation %d, superseded by generation %d, asked about by %s for its call %q", l.JobID, generation, l.Generation, p.ID(), callID)
	_, err := h.s.agentAct(ctx, caller, tree.ActivityToolCall, detail)
	switch {
	case err == nil, errors.Is(err, tree.ErrNodeExited), errors.Is(err, auth.ErrRevoked):
		return nil
	}
	return toConnect(err)
}

// callerOf returns the node whose tool call callID is, for a tool server's
// read naming it: a call this tool server's gate began (the ledger's
// record, not the tool server's or the caller's word), and whether the
// call is still under way (not ended). Any other — not a
// call id, no such call, another gate's — is refused failed_precondition,
// the same for each, so a tool server learns nothing of other gates'
// calls.
func (h *leaseService) callerOf(ctx context.Context, p auth.Principal, callID string) (node string, open bool, err error) {
	if err := wire.CheckID("call_id", callID); err != nil {
		return "", false, toConnect(err)
	}
	c, err := h.s.ledger.GetCall(ctx, callID)
	if errors.Is(err, ledger.ErrCallNotFound) || (err == nil && c.GateID != p.ToolServer()) {
		return "", false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("call_id %q is not a tool call this tool server's gate began", callID))
	}
	if err != nil {
		return "", false, toConnect(err)
	}
	return c.NodeID, c.State != ledger.CallStateEnded, nil
}

// holderGone reports, without writing anything, whether holder may no
// longer act: its exit was confirmed, it was terminated, or it is not a
// registered agent — what fencedByExit answers, for a reader whose read
// gates no side effect (an agent's, an operator's), so that it is never
// kept on the holder as its activity (thirty-sixth pass).
func (h *leaseService) holderGone(ctx context.Context, holder string) (bool, error) {
	n, err := h.agent(ctx, holder)
	if err != nil {
		return false, toConnect(err)
	}
	return n == nil || n.State == tree.NodeStateTerminated || tree.ExitConfirmed(n), nil
}

// admitsFenced reports whether a tool server's read of l (as forFence
// answers it) admits a side effect under generation: the job's current
// generation, ACTIVE, no cancel requested, no ownership conflict. A read
// naming no generation (0) counts as one that admits.
func admitsFenced(l lease.Lease, generation uint64) bool {
	if generation == 0 {
		return true
	}
	return generation == l.Generation && l.State == lease.StateActive && !l.CancelRequested && !l.OwnershipConflict
}

// forFence is what a tool server reads of a job's lease: what its fence
// (agentsdk.IssuedGenerations) needs to refuse a side effect under a
// generation that was never issued or holds no authority now — the job,
// its generation, its state as of now on the coordinator's clock, and,
// while the generation is ACTIVE, when that authority ends and whether a
// cancel was requested or an ownership conflict recorded (seed §7, §9,
// §12: either ends the holder's licence to act). An ACTIVE lease whose
// expiry the clock has reached is answered EXPIRED, as the coordinator
// judges any message for it, before its deadline sweep records it. A tool
// server may be asked about any job by any caller, of any tree: it learns
// nothing of who holds the job (but, for a read naming the current
// generation, whether the holder's exit was confirmed: GetLease's
// holder_exited), the lease id a worker message names, what the holder
// reported (progress, result detail) or what its coordinator decided and
// why.
func forFence(l lease.Lease, now time.Time) lease.Lease {
	out := lease.Lease{JobID: l.JobID, Generation: l.Generation, State: l.State}
	if l.State != lease.StateActive {
		return out
	}
	if !now.Before(l.ExpiresAt) {
		out.State = lease.StateExpired
		return out
	}
	out.ExpiresAt, out.CancelRequested, out.OwnershipConflict = l.ExpiresAt, l.CancelRequested, l.OwnershipConflict
	return out
}

func (h *leaseService) ListLeases(ctx context.Context, req *connect.Request[tetherv1.ListLeasesRequest]) (*connect.Response[tetherv1.ListLeasesResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	holder := req.Msg.HolderIdentity
	if p.IsAgent() && holder == "" {
		holder = p.NodeID()
	}
	if holder != "" {
		if err := wire.CheckID("holder_identity", holder); err != nil {
			return nil, toConnect(err)
		}
		if err := h.mayRead(ctx, p, holder); err != nil {
			return nil, toConnect(err)
		}
	}
	if req.Msg.PageSize < 0 {
		return nil, invalid("page_size must not be negative")
	}
	size := int(req.Msg.PageSize)
	if size == 0 || size > maxPageSize {
		size = maxPageSize
	}
	unserved := h.unserved()
	leases, next, err := h.leases().List(ctx, holder, req.Msg.PageToken, size)
	if err == nil && unserved(leases...) {
		if err = h.awaitServing(ctx); err == nil {
			leases, next, err = h.leases().List(ctx, holder, req.Msg.PageToken, size)
		}
	}
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.Lease, len(leases))
	for i, l := range leases {
		out[i] = wire.Lease(l)
	}
	return connect.NewResponse(&tetherv1.ListLeasesResponse{Leases: out, NextPageToken: next}), nil
}

func (h *leaseService) Evidence(ctx context.Context, req *connect.Request[tetherv1.EvidenceRequest]) (*connect.Response[tetherv1.EvidenceResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if p.IsAgent() {
		if _, err := h.readable(ctx, p, req.Msg.JobId); err != nil {
			return nil, err
		}
	} else if err := wire.CheckID("job_id", req.Msg.JobId); err != nil {
		return nil, toConnect(err)
	} else if _, err := h.settledGet(ctx, p, req.Msg.JobId); err != nil && !errors.Is(err, coordinator.ErrNotFound) {
		// Reading the lease first (as an agent's authorisation does)
		// records what the clock decided before the rows are read: a
		// deadline passed is a row, not a gap until the sweep.
		return nil, toConnect(err)
	}
	if req.Msg.PageSize < 0 {
		return nil, invalid("page_size must not be negative")
	}
	size := int(req.Msg.PageSize)
	if size == 0 || size > maxEvidencePageSize {
		size = maxEvidencePageSize
	}
	cursor, err := parseEvidenceToken(req.Msg.PageToken)
	if err != nil {
		return nil, err
	}
	page, err := h.leases().EvidencePage(ctx, req.Msg.JobId, cursor, size)
	if err != nil {
		return nil, toConnect(err)
	}
	if p.IsAgent() {
		if page.Rows, page.Stale, err = h.treeRows(ctx, p, page.Rows, page.Stale); err != nil {
			return nil, toConnect(err)
		}
	}
	out := make([]*tetherv1.EvidenceRow, len(page.Rows))
	for i, r := range page.Rows {
		out[i] = wire.EvidenceRow(r)
	}
	resp := &tetherv1.EvidenceResponse{Rows: out, StaleCounts: wire.StaleCounts(page.Stale)}
	if page.More {
		resp.NextPageToken = evidenceToken(page.Next)
	}
	return connect.NewResponse(resp), nil
}

// treeRows is what an agent reads of a page of a job's evidence: the rows
// of the generations held by agents of its own tree. A job an operator
// moved between trees has a part in each: an agent of one reads neither
// the rows of the other's generations nor the rows of messages the other
// tree's agents sent after the move (a former holder's late traffic, judged
// against the current generation, whose row quotes what it sent); in the
// other rows, the other tree's agents and lease ids that the row names (the
// generation the move replaced, a settled conflict's claimant) are
// withheld. So a page may hold fewer rows than asked for, none even, while
// more follow. An operator reads every row; nothing is deleted.
//
// Both are decided on what the row says of itself, never on words its
// senders chose: a worker message is the other tree's when its sender —
// named `from "<node>"` in the row's reason, as package lease describes a
// worker message, where no quoted text can forge it — is another tree's
// agent; and only the names a reason is written with are withheld (the
// job's owner and former holders never are). Searching the whole reason for every other-tree
// name the row records let this tree's holder test a guess at who offered
// or held the job: its own progress naming the right agent vanished from
// its evidence (rogue25lease test).
//
// Of the former holders' counts of late messages (stale), it keeps those
// of its own tree's agents: another tree's agent's messages are not its
// rows, nor are their counts.
func (h *leaseService) treeRows(ctx context.Context, p auth.Principal, rows []coordinator.Row, stale []coordinator.StaleCount) ([]coordinator.Row, []coordinator.StaleCount, error) {
	root, err := h.lineage(ctx, p)
	if root == "" || err != nil {
		return nil, nil, err
	}
	ours := map[string]bool{"": true}
	inTree := func(id string) (bool, error) {
		if v, ok := ours[id]; ok {
			return v, nil
		}
		n, err := h.agent(ctx, id)
		if err != nil {
			return false, err
		}
		ours[id] = n != nil && tree.Root(n) == root
		return ours[id], nil
	}
	kept := rows[:0]
	var foreign []string
	for _, r := range rows {
		if ok, err := inTree(r.HolderIdentity); !ok || err != nil {
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		n := r.Names
		if r.Message.FromWorker() {
			// Who sent it: of the agents the row records, the one it
			// names as the sender.
			other := false
			for _, id := range append(n.FormerHolders[:], n.PriorHolder, n.ConflictHolder, n.Owner, n.PriorConflictHolder) {
				if id == "" || !strings.Contains(r.Reason, " from "+strconv.Quote(id)) {
					continue
				}
				ok, err := inTree(id)
				if err != nil {
					return nil, nil, err
				}
				other = other || !ok
			}
			if other {
				continue // another tree's agent's message
			}
		}
		// Whom the row's reason is written with besides its generation's
		// holder, when they are another tree's: the generation the row
		// replaced (the move) and a conflict's claimant.
		foreign = foreign[:0]
		if ok, err := inTree(n.PriorHolder); err != nil {
			return nil, nil, err
		} else if !ok {
			foreign = append(foreign, n.PriorHolder)
			if n.PriorLeaseID != "" {
				foreign = append(foreign, n.PriorLeaseID)
			}
		}
		for _, id := range []string{n.ConflictHolder, n.PriorConflictHolder} {
			if ok, err := inTree(id); err != nil {
				return nil, nil, err
			} else if !ok {
				foreign = append(foreign, id)
			}
		}
		if len(foreign) == 0 {
			kept = append(kept, r)
			continue
		}
		pairs := make([]string, 0, 2*len(foreign))
		for _, id := range foreign {
			pairs = append(pairs, id, "(withheld)")
		}
		withheld := strings.NewReplacer(pairs...)
		r.Reason = withheld.Replace(r.Reason)
		r.Decision.Reason = withheld.Replace(r.Decision.Reason)
		kept = append(kept, r)
	}
	var counts []coordinator.StaleCount
	for _, c := range stale {
		ok, err := inTree(c.Holder)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			counts = append(counts, c)
		}
	}
	return kept, counts, nil
}

// maxEvidencePageSize caps a page of evidence: a row is at most a few KB
// (a reason and a progress value of at most 4 KB each), so one answer
// stays within a few MB however long the job's history.
const maxEvidencePageSize = 1000

// evidenceToken renders a cursor as a page token: "r<row>" for the job's
// rows, "u<seq>" for the unknown-job log.
func evidenceToken(c coordinator.EvidenceCursor) string {
	if c.Unknown {
		return "u" + strconv.FormatUint(c.After, 10)
	}
	return "r" + strconv.FormatUint(c.After, 10)
}

func parseEvidenceToken(token string) (coordinator.EvidenceCursor, error) {
	if token == "" {
		return coordinator.EvidenceCursor{}, nil
	}
	if len(token) > 1 && (token[0] == 'r' || token[0] == 'u') {
		if n, err := strconv.ParseUint(token[1:], 10, 64); err == nil && n > 0 {
			return coordinator.EvidenceCursor{After: n, Unknown: token[0] == 'u'}, nil
		}
	}
	return coordinator.EvidenceCursor{}, invalid("page_token is not a token from an earlier Evidence answer")
}

func (h *leaseService) GetPolicy(context.Context, *connect.Request[tetherv1.GetPolicyRequest]) (*connect.Response[tetherv1.GetPolicyResponse], error) {
	return connect.NewResponse(&tetherv1.GetPolicyResponse{Policy: wire.LeasePolicy(h.leases().Policy())}), nil
}

// Channel judges worker messages as they arrive, each on its own identity,
// generation, sequence and receipt time; answers carry the request's
// correlation_id and may come back in a different order than the requests
// (messages for different jobs are judged on different shards). The
// stream's messages are all from the authenticated agent: holder_identity
// is its node id. When this replica's coordinator stops serving (another
// replica leads now), the next message is answered Unavailable and the
// stream ends with Unavailable once what was in flight is answered; the
// client reconnects and is routed to the leader (forward.go).
func (h *leaseService) Channel(ctx context.Context, stream *connect.BidiStream[tetherv1.ChannelRequest, tetherv1.ChannelResponse]) error {
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	if !p.IsAgent() {
		return denied("%s is not an agent: only holder agents open a lease channel", p.ID())
	}
	// An open channel is a session in the exit evidence's sense, as a
	// signals stream is: while it is open the agent's process is not gone,
	// so a claim of its exit is not corroborated (tree.JudgeExit) until
	// it ends. (A node whose exit was confirmed cannot open one: the
	// interceptor refused it, and SessionOpened would.)
	_, closeSession, err := h.s.storeSession(ctx, p.NodeID(), "lease channel")
	if err != nil {
		return err
	}
	defer closeSession()
	out := &channelOutbox{ready: make(chan struct{}, 1), slots: make(chan struct{}, maxChannelInFlight)}
	sent := make(chan error, 1)
	go func() { sent <- out.pump(stream) }()
	// Each message is activity, as a unary call is (the interceptor's
	// check): a node whose exit was confirmed, or that was terminated,
	// while its channel stayed open works no lease over it, and the
	// attempt is kept against it. The node is read again only when its
	// stored state changed (or after a refusal, so that every attempt is
	// kept), not per message: renewals are this stream's hot path.
	changed, unsubscribe := h.s.signals.Changes(p.NodeID())
	defer unsubscribe()
	var active bool
	activity := func() error {
		select {
		case <-changed:
			active = false
		default:
		}
		if active {
			return nil
		}
		if _, err := h.s.agentAct(ctx, p.NodeID(), tree.ActivityLease, "a lease message on its open channel"); err != nil {
			return err
		}
		active = true
		return nil
	}

	// The stream's messages are received on a goroutine of their own, so
	// that a quiet stream still ends with its context: when the agent's
	// node is terminated (the interceptor cancels it) as when the client
	// goes away. The handler's return ends the blocked Receive.
	type received struct {
		req *tetherv1.ChannelRequest
		err error
	}
	incoming := make(chan received)
	go func() {
		for {
			req, err := stream.Receive()
			select {
			case incoming <- received{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var recvErr error
	for recvErr == nil {
		if out.stopped.Load() {
			// This replica's coordinator stopped serving (another replica
			// leads now): end the stream so that the client reconnects and
			// is routed to the leader (forward.go).
			recvErr = connect.NewError(connect.CodeUnavailable, errors.New("the job leases moved to another replica; reconnect"))
			break
		}
		var r received
		select {
		case r = <-incoming:
		case <-ctx.Done():
			r.err = ctx.Err()
		}
		req, err := r.req, r.err
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		batch := req.Batch
		req.Batch = nil
		if len(batch) > 0 {
			// Each message of a batch costs the lineage's budget like a
			// call of its own (once it is spent, the upkeep of a lease the
			// agent holds is admitted from that lease's allowance).
			if err := auth.SpendMessages(ctx, len(batch), func(k int) any { return batch[k] }); err != nil {
				recvErr = err
				break
			}
			out.batching.Store(true)
		}
		for i := -1; i < len(batch) && recvErr == nil; i++ {
			m := req
			if i >= 0 {
				m = batch[i]
			}
			select {
			case out.slots <- struct{}{}:
			case <-ctx.Done():
				recvErr = ctx.Err()
				continue
			}
			if len(m.Batch) > 0 {
				out.push(&tetherv1.ChannelResponse{CorrelationId: m.CorrelationId, Error: connect.CodeInvalidArgument.String() + ": batch: a batched message cannot carry a batch of its own"})
				continue
			}
			if err := activity(); err != nil {
				out.pushResult(m.CorrelationId, coordinator.Result{}, err)
				continue
			}
			h.submitChannel(ctx, p, m, out)
		}
	}
	// Every judged message is answered before the stream ends.
	for range maxChannelInFlight {
		out.slots <- struct{}{}
	}
	out.close()
	if err := <-sent; err != nil {
		return err
	}
	return recvErr
}

// submitChannel judges one Channel message and queues its answer. The
// stream's messages pass the same checks as unary ones: a node that is not
// running cannot ACK, and a stranger to the job is refused before the lease
// machine (partyGuard on the shard; a lineage check off the shard for
// agents that are not parties).
func (h *leaseService) submitChannel(ctx context.Context, p auth.Principal, req *tetherv1.ChannelRequest, out *channelOutbox) {
	correlation := req.CorrelationId
	m, err := wire.ChannelMessage(req, p.NodeID())
	if err != nil {
		out.push(&tetherv1.ChannelResponse{CorrelationId: correlation, Error: connect.CodeInvalidArgument.String() + ": " + err.Error()})
		return
	}
	m = signed(m, p.ID())
	if _, isAck := m.(lease.Ack); isAck {
		if err := h.takesWork(ctx, p.NodeID(), "acknowledge"); err != nil {
			out.pushResult(correlation, coordinator.Result{}, err)
			return
		}
	}
	// The callback runs on the job's shard: it
	// only queues the result, or hands the rare lineage check to its own
	// goroutine; the pump turns it into a response.
	h.leases().Submit(m, partyGuard(p.NodeID(), m), func(r coordinator.Result, err error) {
		switch {
		case errors.Is(err, coordinator.ErrStopped):
			out.stopped.Store(true)
		case errors.Is(err, errNoLease):
			err = noLease(m.Job())
		case errors.Is(err, errNotParty):
			go func() {
				r, err := h.judgeForLineage(ctx, p, m)
				out.pushResult(correlation, r, err)
			}()
			return
		case err == nil:
			r = forParty(p.NodeID(), m, r)
		}
		out.pushResult(correlation, r, err)
	})
}

// channelAnswer is an answer waiting to be sent: a response, or a result
// the pump converts.
type channelAnswer struct {
	resp        *tetherv1.ChannelResponse
	correlation uint64
	result      coordinator.Result
	err         error
}

func (a channelAnswer) response() *tetherv1.ChannelResponse {
	if a.resp != nil {
		return a.resp
	}
	resp := &tetherv1.ChannelResponse{CorrelationId: a.correlation}
	if a.err != nil {
		var ce *connect.Error
		if errors.As(toConnect(a.err), &ce) {
			resp.Error = ce.Code().String() + ": " + ce.Message()
		}
		return resp
	}
	resp.Lease = wire.Lease(a.result.Lease)
	resp.Decision = wire.Decision(a.result.Decision)
	return resp
}

// maxAnswersPerMessage bounds how many answers one packed ChannelResponse
// carries.
const maxAnswersPerMessage = 64

// channelOutbox hands answers from the shards (which must never block) to
// the one goroutine that may send on the stream. slots bounds what is in
// flight: a slot is taken per request and given back once its answer is
// sent.
type channelOutbox struct {
	// batching: the client sent a batched request, so answers may be
	// packed into ChannelResponse.batch.
	batching atomic.Bool
	// stopped: the coordinator refused a message because it no longer
	// serves; the stream ends after the messages in flight are answered.
	stopped atomic.Bool
	mu      sync.Mutex
	queue   []channelAnswer
	closed  bool
	ready   chan struct{}
	slots   chan struct{}
}

func (o *channelOutbox) push(r *tetherv1.ChannelResponse) { o.add(channelAnswer{resp: r}) }

func (o *channelOutbox) pushResult(correlation uint64, r coordinator.Result, err error) {
	o.add(channelAnswer{correlation: correlation, result: r, err: err})
}

func (o *channelOutbox) add(a channelAnswer) {
	o.mu.Lock()
	o.queue = append(o.queue, a)
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

func (o *channelOutbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// pump sends answers until the outbox is closed and empty. After a send
// fails (the client went away) it keeps draining, so no shard callback or
// receive loop waits on it.
func (o *channelOutbox) pump(stream *connect.BidiStream[tetherv1.ChannelRequest, tetherv1.ChannelResponse]) error {
	var sendErr error
	var batch []channelAnswer
	var msgs []*tetherv1.ChannelResponse
	for {
		o.mu.Lock()
		if len(o.queue) == 0 {
			closed := o.closed
			o.mu.Unlock()
			if closed {
				return sendErr
			}
			<-o.ready
			continue
		}
		batch, o.queue = o.queue, batch[:0]
		o.mu.Unlock()
		packed := o.batching.Load()
		for len(batch) > 0 {
			n := 1
			if packed {
				n = min(len(batch), maxAnswersPerMessage)
			}
			if sendErr == nil {
				msgs = msgs[:0]
				for _, a := range batch[:n] {
					msgs = append(msgs, a.response())
				}
				msg := msgs[0]
				if n > 1 {
					msg = &tetherv1.ChannelResponse{
						CorrelationId: msg.CorrelationId, Lease: msg.Lease, Decision: msg.Decision, Error: msg.Error,
						Batch: msgs[1:n],
					}
				}
				sendErr = stream.Send(msg)
				clear(msgs)
			}
			for i := range n {
				batch[i] = channelAnswer{}
				<-o.slots
			}
			batch = batch[n:]
		}
	}
}

// Leases returns the lease coordinator (the supervisor's LeaseCanceller;
// benchmarks read its Stats).
func (s *Server) Leases() *coordinator.Coordinator { return s.leases }
