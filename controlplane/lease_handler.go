package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
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

// worker judges a worker message from the authenticated holder.
func worker[Resp any](ctx context.Context, h *leaseService, build func(holder string) (lease.Message, error), wrap func(*tetherv1.Lease, *tetherv1.Decision) *Resp) (*connect.Response[Resp], error) {
	p, _ := auth.FromContext(ctx)
	if !p.IsAgent() {
		// Holder binding: the holder identity is the authenticated agent's
		// node id, so only an agent can speak for a lease it holds.
		return nil, denied("%s is not an agent: only the holder agent sends worker messages, with its own credential", p.ID())
	}
	m, err := build(p.NodeID())
	if err != nil {
		return nil, toConnect(err)
	}
	res, err := h.leases().Apply(ctx, m)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(wrap(coordinator.LeaseToProto(res.Lease), coordinator.DecisionToProto(res.Decision))), nil
}

func (h *leaseService) Ack(ctx context.Context, req *connect.Request[tetherv1.AckRequest]) (*connect.Response[tetherv1.AckResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return coordinator.AckMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.AckResponse {
			return &tetherv1.AckResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Renew(ctx context.Context, req *connect.Request[tetherv1.RenewRequest]) (*connect.Response[tetherv1.RenewResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return coordinator.RenewMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.RenewResponse {
			return &tetherv1.RenewResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Progress(ctx context.Context, req *connect.Request[tetherv1.ProgressRequest]) (*connect.Response[tetherv1.ProgressResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return coordinator.ProgressMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.ProgressResponse {
			return &tetherv1.ProgressResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) CancelAck(ctx context.Context, req *connect.Request[tetherv1.LeaseServiceCancelAckRequest]) (*connect.Response[tetherv1.LeaseServiceCancelAckResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return coordinator.CancelAckMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.LeaseServiceCancelAckResponse {
			return &tetherv1.LeaseServiceCancelAckResponse{Lease: l, Decision: d}
		})
}

func (h *leaseService) Complete(ctx context.Context, req *connect.Request[tetherv1.CompleteRequest]) (*connect.Response[tetherv1.CompleteResponse], error) {
	return worker(ctx, h, func(holder string) (lease.Message, error) { return coordinator.CompleteMessage(req.Msg, holder) },
		func(l *tetherv1.Lease, d *tetherv1.Decision) *tetherv1.CompleteResponse {
			return &tetherv1.CompleteResponse{Lease: l, Decision: d}
		})
}

// mayDirect reports whether p may direct leases held by holder: operators
// may, and so may an agent that is an ancestor of holder in the agent
// tree (never the holder itself, nor a sibling or descendant).
func (h *leaseService) mayDirect(ctx context.Context, p auth.Principal, holder, field string) error {
	if !p.IsAgent() {
		return nil
	}
	node, err := h.s.tree.Get(ctx, holder)
	if errors.Is(err, supervisor.ErrNodeNotFound) || errors.Is(err, supervisor.ErrInvalidArgument) {
		return denied("agent %s may direct only leases held by its descendants; %s %q is not a registered agent", p.NodeID(), field, holder)
	}
	if err != nil {
		return err
	}
	if !supervisor.IsAncestor(node, p.NodeID()) {
		return denied("agent %s may direct only leases held by its descendants, and %s %s is not one", p.NodeID(), field, holder)
	}
	return nil
}

// coordinate judges a coordinator message about an existing job: the
// caller must be an operator or an ancestor of the current holder (and of
// newHolder, when the message names one). The check is made against the
// durable lease and re-asserted on the shard (the holder must still be the
// one checked), so a concurrent reassignment cannot slip in between.
func (h *leaseService) coordinate(ctx context.Context, job string, build func(current lease.Lease) (lease.Message, error), newHolder string) (coordinator.Result, error) {
	p, _ := auth.FromContext(ctx)
	if err := coordinator.CheckID("job_id", job); err != nil {
		return coordinator.Result{}, err
	}
	for attempt := 0; ; attempt++ {
		current, err := h.leases().Get(ctx, job)
		if err != nil && !errors.Is(err, coordinator.ErrNotFound) {
			return coordinator.Result{}, err
		}
		if current.Exists() {
			if err := h.mayDirect(ctx, p, current.HolderIdentity, "the holder"); err != nil {
				return coordinator.Result{}, err
			}
		}
		if newHolder != "" {
			if err := h.checkHolder(ctx, p, newHolder); err != nil {
				return coordinator.Result{}, err
			}
		}
		m, err := build(current)
		if err != nil {
			return coordinator.Result{}, err
		}
		res, err := h.leases().ApplyIf(ctx, m, func(l lease.Lease) error {
			if l.Exists() != current.Exists() || l.HolderIdentity != current.HolderIdentity {
				return fmt.Errorf("%w: job %q changed holder while the request was checked; retry", coordinator.ErrPrecondition, job)
			}
			return nil
		})
		if errors.Is(err, coordinator.ErrPrecondition) && attempt < 3 {
			continue
		}
		return res, err
	}
}

// checkHolder checks that a holder named in an Offer or Reassign is a
// registered agent the caller may direct.
func (h *leaseService) checkHolder(ctx context.Context, p auth.Principal, holder string) error {
	if err := id.Check(id.Node, "holder_identity", holder); err != nil {
		return invalid("%v", err)
	}
	if p.IsAgent() {
		return h.mayDirect(ctx, p, holder, "holder_identity")
	}
	if _, err := h.s.tree.Get(ctx, holder); err != nil {
		if errors.Is(err, supervisor.ErrNodeNotFound) {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("holder_identity %s is not a registered agent", holder))
		}
		return err
	}
	return nil
}

func (h *leaseService) Offer(ctx context.Context, req *connect.Request[tetherv1.OfferRequest]) (*connect.Response[tetherv1.OfferResponse], error) {
	p, _ := auth.FromContext(ctx)
	m, err := coordinator.OfferMessage(req.Msg, id.New(id.Lease), h.leases().Policy())
	if err != nil {
		return nil, toConnect(err)
	}
	if err := h.checkHolder(ctx, p, req.Msg.HolderIdentity); err != nil {
		return nil, toConnect(err)
	}
	res, err := h.leases().Apply(ctx, m)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.OfferResponse{Lease: coordinator.LeaseToProto(res.Lease), Decision: coordinator.DecisionToProto(res.Decision)}), nil
}

func (h *leaseService) Reassign(ctx context.Context, req *connect.Request[tetherv1.ReassignRequest]) (*connect.Response[tetherv1.ReassignResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, func(current lease.Lease) (lease.Message, error) {
		return coordinator.ReassignMessage(req.Msg, id.New(id.Lease), current, h.leases().Policy())
	}, req.Msg.HolderIdentity)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ReassignResponse{Lease: coordinator.LeaseToProto(res.Lease), Decision: coordinator.DecisionToProto(res.Decision)}), nil
}

func (h *leaseService) RequestCancel(ctx context.Context, req *connect.Request[tetherv1.RequestCancelRequest]) (*connect.Response[tetherv1.RequestCancelResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, func(lease.Lease) (lease.Message, error) {
		return coordinator.RequestCancelMessage(req.Msg)
	}, "")
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RequestCancelResponse{Lease: coordinator.LeaseToProto(res.Lease), Decision: coordinator.DecisionToProto(res.Decision)}), nil
}

func (h *leaseService) Resolve(ctx context.Context, req *connect.Request[tetherv1.ResolveRequest]) (*connect.Response[tetherv1.ResolveResponse], error) {
	res, err := h.coordinate(ctx, req.Msg.JobId, func(lease.Lease) (lease.Message, error) {
		return coordinator.ResolveMessage(req.Msg, h.leases().Policy())
	}, "")
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ResolveResponse{Lease: coordinator.LeaseToProto(res.Lease), Decision: coordinator.DecisionToProto(res.Decision)}), nil
}

// mayRead reports whether p may read leases held by holder: operators of
// any role, the holder itself and its ancestors.
func (h *leaseService) mayRead(ctx context.Context, p auth.Principal, holder string) error {
	if !p.IsAgent() || holder == p.NodeID() {
		return nil
	}
	return h.mayDirect(ctx, p, holder, "the holder")
}

func (h *leaseService) GetLease(ctx context.Context, req *connect.Request[tetherv1.GetLeaseRequest]) (*connect.Response[tetherv1.GetLeaseResponse], error) {
	p, _ := auth.FromContext(ctx)
	if err := coordinator.CheckID("job_id", req.Msg.JobId); err != nil {
		return nil, toConnect(err)
	}
	l, err := h.leases().Get(ctx, req.Msg.JobId)
	if err != nil {
		return nil, toConnect(err)
	}
	if err := h.mayRead(ctx, p, l.HolderIdentity); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.GetLeaseResponse{Lease: coordinator.LeaseToProto(l)}), nil
}

func (h *leaseService) ListLeases(ctx context.Context, req *connect.Request[tetherv1.ListLeasesRequest]) (*connect.Response[tetherv1.ListLeasesResponse], error) {
	p, _ := auth.FromContext(ctx)
	holder := req.Msg.HolderIdentity
	if p.IsAgent() && holder == "" {
		holder = p.NodeID()
	}
	if holder != "" {
		if err := coordinator.CheckID("holder_identity", holder); err != nil {
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
	leases, next, err := h.leases().List(ctx, holder, req.Msg.PageToken, size)
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.Lease, len(leases))
	for i, l := range leases {
		out[i] = coordinator.LeaseToProto(l)
	}
	return connect.NewResponse(&tetherv1.ListLeasesResponse{Leases: out, NextPageToken: next}), nil
}

func (h *leaseService) Evidence(ctx context.Context, req *connect.Request[tetherv1.EvidenceRequest]) (*connect.Response[tetherv1.EvidenceResponse], error) {
	p, _ := auth.FromContext(ctx)
	if err := coordinator.CheckID("job_id", req.Msg.JobId); err != nil {
		return nil, toConnect(err)
	}
	if p.IsAgent() {
		l, err := h.leases().Get(ctx, req.Msg.JobId)
		if err != nil {
			return nil, toConnect(err)
		}
		if err := h.mayRead(ctx, p, l.HolderIdentity); err != nil {
			return nil, toConnect(err)
		}
	}
	rows, err := h.leases().Evidence(ctx, req.Msg.JobId)
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.EvidenceRow, len(rows))
	for i, r := range rows {
		out[i] = coordinator.RowToProto(r)
	}
	return connect.NewResponse(&tetherv1.EvidenceResponse{Rows: out}), nil
}

func (h *leaseService) GetPolicy(context.Context, *connect.Request[tetherv1.GetPolicyRequest]) (*connect.Response[tetherv1.GetPolicyResponse], error) {
	return connect.NewResponse(&tetherv1.GetPolicyResponse{Policy: coordinator.PolicyToProto(h.leases().Policy())}), nil
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
	p, _ := auth.FromContext(ctx)
	if !p.IsAgent() {
		return denied("%s is not an agent: only holder agents open a lease channel", p.ID())
	}
	holder := p.NodeID()
	out := &channelOutbox{ready: make(chan struct{}, 1), slots: make(chan struct{}, maxChannelInFlight)}
	sent := make(chan error, 1)
	go func() { sent <- out.pump(stream) }()

	var recvErr error
	for recvErr == nil {
		if out.stopped.Load() {
			// This replica's coordinator stopped serving (another replica
			// leads now): end the stream so that the client reconnects and
			// is routed to the leader (forward.go).
			recvErr = connect.NewError(connect.CodeUnavailable, errors.New("the job leases moved to another replica; reconnect"))
			break
		}
		req, err := stream.Receive()
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
			// call of its own.
			if err := auth.Spend(ctx, len(batch)); err != nil {
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
			h.submitChannel(m, holder, out)
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

// submitChannel judges one Channel message and queues its answer.
func (h *leaseService) submitChannel(req *tetherv1.ChannelRequest, holder string, out *channelOutbox) {
	correlation := req.CorrelationId
	m, err := coordinator.ChannelMessage(req, holder)
	if err != nil {
		out.push(&tetherv1.ChannelResponse{CorrelationId: correlation, Error: connect.CodeInvalidArgument.String() + ": " + err.Error()})
		return
	}
	// The callback runs on the coordinator's committer: it only queues the
	// result; the pump turns it into a response.
	h.leases().Submit(m, nil, func(r coordinator.Result, err error) {
		if errors.Is(err, coordinator.ErrStopped) {
			out.stopped.Store(true)
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
	resp.Lease = coordinator.LeaseToProto(a.result.Lease)
	resp.Decision = coordinator.DecisionToProto(a.result.Decision)
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
