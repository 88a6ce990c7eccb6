package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/leader"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// Forwarding LeaseService to the leader.
//
// The lease coordinator keeps every lease in memory on one replica, the
// leader (docs/design.md §6), so with several replicas on etcd only the leader
// can judge a lease message. Every replica still serves LeaseService: a
// replica whose coordinator does not serve forwards the call, over
// Connect, to the replica the election names, presenting the caller's own
// Authorization header. The leader authenticates and authorises the call
// again, exactly as if the caller had come to it directly; a forwarded
// call carries no authority of the forwarding replica.
//
// What is forwarded and what is not (docs/design.md §6 states the rule):
// every message that is judged (Offer … Resolve, and the Channel stream)
// goes to the leader, which alone holds the pending leases it is judged
// against; ListLeases too, because the leader lists from memory what a
// follower would have to rebuild lease by lease from the store. The point
// reads — GetLease, Evidence, GetPolicy — are served where they arrive:
// the lease and its evidence are durable state, which every replica reads
// from the store with a linearizable read, so a follower answers exactly
// what the leader would, without the hop, and even while no replica leads.
//
// Trade-offs, chosen for simplicity:
//   - A forwarded call costs one more hop and a second authentication.
//     Agents that renew at high rates can connect to the leader directly
//     (any replica works; the leader is fastest).
//   - A forwarded call is never forwarded again (forwardedHeader): during
//     a change of leadership it waits on the replica it reached, up to
//     routeWait, for that replica to serve, instead of bouncing between
//     replicas — while that replica knows of no other leader. One that
//     reached a replica knowing another replica leads is refused
//     Unavailable at once (the mark is not authenticated: a caller that
//     sets it on a call to a follower is not held there).
//   - A Channel stream is bound to the leader it was routed to. When that
//     leader stops serving (it dies, loses the election, or another
//     replica is elected) the stream ends with Unavailable, and the
//     client reconnects — to any replica — and is routed afresh. Messages
//     in flight when it ended may or may not have been judged: like any
//     unanswered message, the client retries them (the lease protocol
//     judges each on its own identity, generation and sequence, so a
//     repeated renew is a DUPLICATE, never a second extension).
//   - A unary call answered Unavailable likewise may be retried anywhere.

const (
	// forwardedHeader marks a call forwarded by a replica (its value names
	// the replica), so that it is never forwarded again.
	forwardedHeader = "Tether-Forwarded-By"
	// routeWait bounds how long a call waits for some replica to serve
	// the leases while leadership changes, before it is refused with
	// Unavailable (the caller retries).
	routeWait = 5 * time.Second
)

// errNoLeader: nobody serves the leases at the moment.
var errNoLeader = errors.New("no replica serves the job leases right now (the leadership is changing); retry")

// errForwardedHere: a call marked as forwarded reached a replica that
// does not serve the leases and knows another replica leads.
var errForwardedHere = errors.New("this replica does not serve the job leases and does not forward a call marked as already forwarded (" + forwardedHeader + "); retry")

// leaseRouter decides, for each LeaseService call, whether this replica
// serves it (its coordinator serves) or forwards it to the leader the
// election names.
type leaseRouter struct {
	leases   *coordinator.Coordinator
	observer leader.Observer
	self     leader.Candidate
	http     *http.Client
	log      *slog.Logger

	mu      sync.Mutex
	leader  leader.Candidate
	changed chan struct{} // closed when leader changes
	clients map[string]tetherv1connect.LeaseServiceClient
}

// buildLeaseRouting makes LeaseService forward to the leader when the
// elector can say which replica leads (several replicas on etcd); with a
// single replica every call is served here and nothing is built.
func (s *Server) buildLeaseRouting() {
	observer, ok := s.cfg.Elector.(leader.Observer)
	if !ok {
		return
	}
	s.router = &leaseRouter{
		leases:   s.leases,
		observer: observer,
		self:     observer.Self(),
		http:     peerClient(s.cfg.peerTLS()),
		log:      s.log,
		changed:  make(chan struct{}),
		clients:  map[string]tetherv1connect.LeaseServiceClient{},
	}
	if s.router.self.Address == "" {
		s.log.Warn("this replica publishes no address in the leader election: while it leads, the other replicas cannot forward job-lease calls to it (set --advertise-url)")
	}
	s.addComponent("lease-router", s.router.run)
}

// leaseHandler is the LeaseService handler: the local one, behind the
// forwarder when there are several replicas.
func (s *Server) leaseHandler() tetherv1connect.LeaseServiceHandler {
	local := &leaseService{s: s}
	if s.router == nil {
		return local
	}
	return &leaseForwarder{local: local, router: s.router}
}

// peerClient speaks HTTP/2 to the other replicas: cleartext for http://
// addresses, TLS (verified with tlsConfig, nil: the system roots) for
// https:// ones. HTTP/2 pings find a dead leader within about 15s on an
// idle connection.
//
// The leader's answers of a relayed Channel wait in this client while the
// relay waits to write them to a caller who takes none (it grants no
// flow-control window): the client grants each stream
// MaxReceiveBufferBytes of them, as the server grants a request's body,
// so that a rogue's unread Channels through this replica park no more
// here than that each (Go's default: 4 MiB a stream, over the streams a
// lineage may hold; rogue44g test), the rest waiting in the leader's own
// bound of answers in flight (maxChannelInFlight), as for a Channel
// opened to the leader itself. The connection's window is left at Go's default (1 GiB), which
// its streams (the leader's MaxStreamsPerConn) cannot fill: one caller's
// unread answers never stall the others' forwarded calls on it.
func peerClient(tlsConfig *tls.Config) *http.Client {
	protocols := new(http.Protocols)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols:           protocols,
		TLSClientConfig:     tlsConfig,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:           10 * time.Second,
			PingTimeout:               5 * time.Second,
			MaxReceiveBufferPerStream: MaxReceiveBufferBytes,
		},
	}}
}

// run follows the election until ctx ends.
func (r *leaseRouter) run(ctx context.Context) error {
	return r.observer.Observe(ctx, r.setLeader)
}

func (r *leaseRouter) setLeader(c leader.Candidate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.Identity != "" && c.Address == "" && c.Identity != r.self.Identity {
		r.log.Warn("the leading replica publishes no address: job-lease calls to this replica cannot be forwarded to it", "leader", c.Identity)
	}
	r.leader = c
	close(r.changed)
	r.changed = make(chan struct{})
}

// current returns the leader the election names and a channel closed when
// that changes.
func (r *leaseRouter) current() (leader.Candidate, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leader, r.changed
}

// route returns nil when this replica serves the call, or the client of
// the leader to forward it to (and the leader). A call that was forwarded
// already (header) is only ever served here, and refused Unavailable at
// once when the election names another replica. While neither holds it
// waits, up to routeWait, then refuses the call with Unavailable.
func (r *leaseRouter) route(ctx context.Context, header http.Header) (tetherv1connect.LeaseServiceClient, leader.Candidate, error) {
	forwarded := header.Get(forwardedHeader) != ""
	timeout := time.NewTimer(routeWait)
	defer timeout.Stop()
	for {
		serving, servingChanged := r.leases.Serving()
		if serving {
			return nil, leader.Candidate{}, nil
		}
		l, leaderChanged := r.current()
		other := l.Address != "" && l.Identity != r.self.Identity && l.Address != r.self.Address
		if other && !forwarded {
			return r.client(l.Address), l, nil
		}
		if other {
			// Marked as forwarded, to a replica that knows another one
			// leads: the replica that sent it was behind the election,
			// or the caller set the mark itself. Nothing here will serve
			// it unless the election names this replica, so it is
			// refused at once, not held: the caller retries, anywhere.
			return nil, leader.Candidate{}, connect.NewError(connect.CodeUnavailable, errForwardedHere)
		}
		select {
		case <-servingChanged:
		case <-leaderChanged:
		case <-ctx.Done():
			return nil, leader.Candidate{}, toConnect(ctx.Err())
		case <-timeout.C:
			return nil, leader.Candidate{}, connect.NewError(connect.CodeUnavailable, errNoLeader)
		}
	}
}

// client returns the LeaseService client of the replica at address.
func (r *leaseRouter) client(address string) tetherv1connect.LeaseServiceClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.clients[address]
	if !ok {
		c = tetherv1connect.NewLeaseServiceClient(r.http, strings.TrimRight(address, "/"))
		r.clients[address] = c
	}
	return c
}

// prepare sets the headers of a forwarded call: the caller's credential
// (the leader authenticates it again), its trace context, and the mark
// that stops it from being forwarded again.
func (r *leaseRouter) prepare(out, in http.Header) {
	for _, h := range []string{"Authorization", "Traceparent", "Tracestate"} {
		if v := in.Values(h); len(v) > 0 {
			out[h] = v
		}
	}
	out.Set(forwardedHeader, r.self.Identity)
}

// upstreamError is what the caller sees of a forwarded call's failure: the
// leader's own error as it sent it, or Unavailable when the leader could
// not be reached (the caller retries; the details stay in this log).
func (r *leaseRouter) upstreamError(ctx context.Context, to leader.Candidate, err error) error {
	if ctx.Err() != nil {
		return toConnect(ctx.Err())
	}
	var ce *connect.Error
	if connect.IsWireError(err) && errors.As(err, &ce) {
		out := connect.NewError(ce.Code(), errors.New(ce.Message()))
		for _, d := range ce.Details() {
			out.AddDetail(d)
		}
		return out
	}
	r.log.Warn("forwarding a job-lease call to the leader failed", "leader", to.Identity, "address", to.Address, "error", err)
	return connect.NewError(connect.CodeUnavailable, errors.New("the leading replica could not be reached; retry"))
}

// leaseForwarder is LeaseService on a replica among several: each call is
// served here while this replica's coordinator serves, and forwarded to
// the leader otherwise.
type leaseForwarder struct {
	local  *leaseService
	router *leaseRouter
}

var _ tetherv1connect.LeaseServiceHandler = (*leaseForwarder)(nil)

// forwardUnary serves req here or forwards it. A call refused here because
// the coordinator stopped serving in the meantime (coordinator.ErrStopped:
// nothing was judged) is routed once more.
func forwardUnary[Req, Resp any](ctx context.Context, f *leaseForwarder, req *connect.Request[Req],
	local func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	remote func(tetherv1connect.LeaseServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
) (*connect.Response[Resp], error) {
	for attempt := 0; ; attempt++ {
		client, to, err := f.router.route(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		if client == nil {
			resp, err := local(ctx, req)
			if err != nil && attempt == 0 && errors.Is(err, coordinator.ErrStopped) {
				continue
			}
			return resp, err
		}
		out := connect.NewRequest(req.Msg)
		f.router.prepare(out.Header(), req.Header())
		resp, err := remote(client, ctx, out)
		if err != nil {
			return nil, f.router.upstreamError(ctx, to, err)
		}
		return connect.NewResponse(resp.Msg), nil
	}
}

func (f *leaseForwarder) Offer(ctx context.Context, req *connect.Request[tetherv1.OfferRequest]) (*connect.Response[tetherv1.OfferResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Offer, tetherv1connect.LeaseServiceClient.Offer)
}

func (f *leaseForwarder) Ack(ctx context.Context, req *connect.Request[tetherv1.AckRequest]) (*connect.Response[tetherv1.AckResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Ack, tetherv1connect.LeaseServiceClient.Ack)
}

func (f *leaseForwarder) Renew(ctx context.Context, req *connect.Request[tetherv1.RenewRequest]) (*connect.Response[tetherv1.RenewResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Renew, tetherv1connect.LeaseServiceClient.Renew)
}

func (f *leaseForwarder) Progress(ctx context.Context, req *connect.Request[tetherv1.ProgressRequest]) (*connect.Response[tetherv1.ProgressResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Progress, tetherv1connect.LeaseServiceClient.Progress)
}

func (f *leaseForwarder) RequestCancel(ctx context.Context, req *connect.Request[tetherv1.RequestCancelRequest]) (*connect.Response[tetherv1.RequestCancelResponse], error) {
	return forwardUnary(ctx, f, req, f.local.RequestCancel, tetherv1connect.LeaseServiceClient.RequestCancel)
}

func (f *leaseForwarder) CancelAck(ctx context.Context, req *connect.Request[tetherv1.LeaseServiceCancelAckRequest]) (*connect.Response[tetherv1.LeaseServiceCancelAckResponse], error) {
	return forwardUnary(ctx, f, req, f.local.CancelAck, tetherv1connect.LeaseServiceClient.CancelAck)
}

func (f *leaseForwarder) Complete(ctx context.Context, req *connect.Request[tetherv1.CompleteRequest]) (*connect.Response[tetherv1.CompleteResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Complete, tetherv1connect.LeaseServiceClient.Complete)
}

func (f *leaseForwarder) Reassign(ctx context.Context, req *connect.Request[tetherv1.ReassignRequest]) (*connect.Response[tetherv1.ReassignResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Reassign, tetherv1connect.LeaseServiceClient.Reassign)
}

func (f *leaseForwarder) Resolve(ctx context.Context, req *connect.Request[tetherv1.ResolveRequest]) (*connect.Response[tetherv1.ResolveResponse], error) {
	return forwardUnary(ctx, f, req, f.local.Resolve, tetherv1connect.LeaseServiceClient.Resolve)
}

// GetLease is served by every replica: where the coordinator does not
// serve, it reads the lease from the store (coordinator.StoredLease), with
// a linearizable read on etcd — every decision acknowledged before the
// call is in it, whichever replica made it — and the same authorisation.
//
// A lease whose deadline the declared clock has passed is not answered as
// the store holds it (an ACTIVE lease past its expiry, an offer past its
// ACK deadline): only the leader records what the clock decided, so such a
// read goes to it, which settles the deadline before answering (the
// coordinator's reads do). A tool server's read is answered here: it is
// told an ACTIVE lease past its expiry is EXPIRED (forFence), and nothing
// else it reads admits a side effect.
//
// Whether the read was settled is the read's own answer (settledGet:
// coordinator.ErrStopped when it read the store and a deadline passed),
// not a check of whether this replica serves taken before or after it: a
// replica whose coordinator began serving around its read, and a leader
// deposed between such a check and its read, both read the store before a
// serving coordinator decided the deadline; forwardUnary then routes the
// read to whoever serves now, here or the leader, or answers Unavailable
// while nobody does.
func (f *leaseForwarder) GetLease(ctx context.Context, req *connect.Request[tetherv1.GetLeaseRequest]) (*connect.Response[tetherv1.GetLeaseResponse], error) {
	resp, err := f.local.GetLease(ctx, req)
	if err == nil || !errors.Is(err, coordinator.ErrStopped) {
		return resp, err
	}
	return forwardUnary(ctx, f, req, f.local.GetLease, tetherv1connect.LeaseServiceClient.GetLease)
}

func (f *leaseForwarder) ListLeases(ctx context.Context, req *connect.Request[tetherv1.ListLeasesRequest]) (*connect.Response[tetherv1.ListLeasesResponse], error) {
	return forwardUnary(ctx, f, req, f.local.ListLeases, tetherv1connect.LeaseServiceClient.ListLeases)
}

// Evidence is served by every replica: the rows are read from the store
// on any replica, and so is the lease its authorisation looks at (see
// GetLease).
//
// As for GetLease, a job whose deadline the clock has passed has its
// evidence read through the leader, which records the deadline's row first
// — whoever reads it: unlike GetLease's, a tool server's evidence would be
// the rows as stored, with no forFence to answer what the clock decided.
// (The policy admits no tool server to Evidence today; this keeps its
// answer right should it ever.)
func (f *leaseForwarder) Evidence(ctx context.Context, req *connect.Request[tetherv1.EvidenceRequest]) (*connect.Response[tetherv1.EvidenceResponse], error) {
	if serving, _ := f.local.leases().Serving(); !serving {
		l, err := f.local.leases().StoredLease(ctx, req.Msg.JobId)
		if err == nil && lease.Due(l, f.local.s.cfg.Clock.Now()) {
			return forwardUnary(ctx, f, req, f.local.Evidence, tetherv1connect.LeaseServiceClient.Evidence)
		}
	}
	// A leader deposed after that check reads the lease (its
	// authorisation, or an operator's settling read) from the store:
	// settledGet answers ErrStopped for a lease whose deadline passed,
	// and the read goes to whoever serves now.
	resp, err := f.local.Evidence(ctx, req)
	if err == nil || !errors.Is(err, coordinator.ErrStopped) {
		return resp, err
	}
	return forwardUnary(ctx, f, req, f.local.Evidence, tetherv1connect.LeaseServiceClient.Evidence)
}

// GetPolicy is served by every replica: the policy is configuration, the
// same everywhere.
func (f *leaseForwarder) GetPolicy(ctx context.Context, req *connect.Request[tetherv1.GetPolicyRequest]) (*connect.Response[tetherv1.GetPolicyResponse], error) {
	return f.local.GetPolicy(ctx, req)
}

// Channel binds the stream to this replica's coordinator when it serves,
// or relays it to the leader: requests up, answers down, until either
// side ends. A change of leader ends the relay with Unavailable, so that
// the client reconnects and is routed to the new one.
func (f *leaseForwarder) Channel(ctx context.Context, stream *connect.BidiStream[tetherv1.ChannelRequest, tetherv1.ChannelResponse]) error {
	client, to, err := f.router.route(ctx, stream.RequestHeader())
	if err != nil {
		return err
	}
	if client == nil {
		return f.local.Channel(ctx, stream)
	}
	upCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// End the relay when the election names another leader.
	moved := make(chan struct{})
	go func() {
		for {
			l, changed := f.router.current()
			if l != to {
				close(moved)
				cancel()
				return
			}
			select {
			case <-changed:
			case <-upCtx.Done():
				return
			}
		}
	}()
	up := client.Channel(upCtx)
	f.router.prepare(up.RequestHeader(), stream.RequestHeader())
	// A cancelled context alone does not end an HTTP/2 stream whose
	// request side is idle: close both sides, which unblocks up.Receive.
	stop := context.AfterFunc(upCtx, func() {
		_ = up.CloseRequest()
		_ = up.CloseResponse()
	})
	defer stop()
	// Requests: caller → leader. When the handler returns, the server
	// closes the request body, which ends a Receive still waiting here.
	go func() {
		for {
			req, err := stream.Receive()
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = up.CloseRequest()
				} else {
					cancel()
				}
				return
			}
			if err := up.Send(req); err != nil {
				// The leader's side ended; up.Receive says why.
				return
			}
		}
	}()
	// Answers: leader → caller.
	for {
		resp, err := up.Receive()
		if err != nil {
			_ = up.CloseResponse()
			switch {
			case errors.Is(err, io.EOF):
				return nil
			case ctx.Err() != nil:
				return toConnect(ctx.Err())
			}
			select {
			case <-moved:
				return connect.NewError(connect.CodeUnavailable, errors.New("the leading replica changed; reconnect"))
			default:
			}
			return f.router.upstreamError(ctx, to, err)
		}
		if err := stream.Send(resp); err != nil {
			cancel()
			_ = up.CloseResponse()
			return err
		}
	}
}

// afterLeases runs a leader-only component once the lease coordinator of
// the same term serves, so that a reconciler that cancels or hands over
// leases does not start against a coordinator still loading the store.
func (s *Server) afterLeases(run func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for {
			serving, changed := s.leases.Serving()
			if serving {
				return run(ctx)
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil
			}
		}
	}
}
