package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Session is an agent's control stream. The agent says hello for its own
// node; the control plane answers with the node and, at once, the signal its
// state calls for; later signals are pushed the moment the node's stored
// state changes (not on the heartbeat cadence). Heartbeats refresh last
// seen and, near expiry, the agent's credential. An exit message claims the
// agent's own exit and ends the session. The session's opening and end are
// stored on the node: the record weighs an exit confirmation against them.
func (a *agentService) Session(ctx context.Context, stream *connect.BidiStream[tetherv1.SessionRequest, tetherv1.SessionResponse]) error {
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return invalid("the first session message must be hello")
	}
	if hello.NodeId != p.NodeID() {
		return denied("agent %s may open a session only for its own node, not node_id %s", p.NodeID(), hello.NodeId)
	}
	node, signals, closeSession, err := a.s.openSession(ctx, p.NodeID(), "session")
	if err != nil {
		return err
	}
	defer closeSession()

	out := make(chan *tetherv1.SessionResponse, 8)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { recvErr <- a.receiveSession(ctx, stream, p, out) }()

	send := func(m *tetherv1.SessionResponse) error { return stream.Send(m) }
	if err := send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Opened{Opened: &tetherv1.SessionOpened{Node: wire.Node(node)}}}); err != nil {
		return err
	}
	signal, resend, stopFollowing := a.s.signalsOut(ctx)
	defer stopFollowing()
	if sig := tree.SignalFor(node); sig != nil {
		if err := send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Signal{Signal: signal(sig)}}); err != nil {
			return err
		}
	}
	for {
		select {
		case <-resend.wake:
			if sig := resend.again(); sig != nil {
				if err := send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Signal{Signal: signal(sig)}}); err != nil {
					return err
				}
			}
		case sig := <-signals:
			if err := send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Signal{Signal: signal(sig)}}); err != nil {
				return err
			}
			// The session dies with the node: once it is terminated, its
			// credential is revoked and nothing more is served on it.
			if err := a.s.sessionAlive(ctx, p.NodeID()); err != nil {
				return err
			}
		case m := <-out:
			if err := send(m); err != nil {
				return err
			}
		case err := <-recvErr:
			if err == nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		case <-ctx.Done():
			// The stream was ended for the session (its credential's
			// revocation, its node's end: the interceptor answers with
			// the cause), or the client went: a session that sent
			// nothing waited here for a message that never came (rogue45b
			// test). A signal already come is told first, as before: a
			// node's end wakes the interceptor's watch and this session
			// with the same signal.
			for {
				select {
				case sig := <-signals:
					if err := send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Signal{Signal: signal(sig)}}); err != nil {
						return nil
					}
					continue
				default:
				}
				return nil
			}
		}
	}
}

// signalOut is sig as a session (WatchSignals, Heartbeat) sends it: a
// drain's carries its termination's next deadline on the node (stopDeadline)
// once the termination has set it. It is the control plane's own, on its
// clock, read from the stored termination per signal sent (as sessionAlive
// reads the node): the agent learns until when it has, and can stretch
// nothing by it (the reconciler acts on the termination it holds). A read
// that fails leaves it out: the signal itself is the order.
func (s *Server) signalOut(ctx context.Context, sig *tree.SessionSignal) *tetherv1.SessionSignal {
	if sig != nil && sig.Kind == tree.SignalKindDrain && sig.TerminationID != "" {
		if t, err := s.supervisor.Get(ctx, sig.TerminationID); err == nil {
			if d := stopDeadline(t); !d.IsZero() {
				withDeadline := *sig
				withDeadline.Deadline = d
				sig = &withDeadline
			}
		}
	}
	return wire.SessionSignal(sig)
}

// stopDeadline is when a termination that drains a node next acts on its
// own: while it drains, its drain deadline (the calls still in flight are
// then cancelled, the node aborted); once the drain ended (every call
// ended; the drain of a node with none ends at its mark) and its grants
// are revoked, its confirmation deadline (its record is then written, the
// node terminated and its credential refused; an exit unclaimed by then is
// unaccounted). Zero before the termination set either (its request marks
// its root draining before its mark sets the drain deadline; the stream's
// drainFollower sends the signal again once it is set, and once it moves
// on to the confirmation deadline).
func stopDeadline(t supervisor.Termination) time.Time {
	switch t.Phase {
	case supervisor.PhaseDraining:
		return t.DrainDeadline
	case supervisor.PhaseReconciling:
		if t.Revoked {
			return t.ConfirmDeadline
		}
	}
	return time.Time{}
}

// sessionAlive returns Unauthenticated once the session's node is
// terminated (or gone): the credential the session was opened with is
// revoked, so the session ends as a new call with it would be refused.
func (s *Server) sessionAlive(ctx context.Context, nodeID string) error {
	_, err := s.nodeAlive(ctx, nodeID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, auth.ErrRevoked):
		return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w; the session is over", err))
	}
	return toConnect(err)
}

// agentEnded waits beside an agent's open stream until its node is
// terminated or unknown (an error wrapping auth.ErrRevoked), its exit is
// confirmed (a FailedPrecondition *connect.Error; not for its sessions or
// lease Channel) or ctx ends (nil). It reads the node when it is signalled
// (a node that is stopping, stopped or exited), not at every change of a
// running node: a running agent's heartbeats wake none of its streams.
func (s *Server) agentEnded(ctx context.Context, nodeID string) error {
	// An exited node may not act (its next call is refused), so its
	// streams that serve it without judging each message (the revocation
	// feed) end too. Not its sessions (Session, WatchSignals), whose end is
	// evidence weighed against its claim, nor its lease Channel, whose
	// every message is refused and kept as a contradiction.
	procedure := auth.ProcedureFromContext(ctx)
	keep := activityOf(procedure) == tree.ActivitySession || procedure == tetherv1connect.LeaseServiceChannelProcedure
	signals, unsubscribe := s.signals.Subscribe(nodeID)
	defer unsubscribe()
	for {
		if _, err := s.nodeAlive(ctx, nodeID); errors.Is(err, auth.ErrRevoked) {
			return err
		}
		if !keep {
			if n, err := s.tree.Get(ctx, nodeID); err == nil && tree.ExitConfirmed(n) && n.State != tree.NodeStateTerminated {
				by := n.ExitConfirmedBy
				if by == "" {
					by = "someone"
				}
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s's exit was confirmed by %s at %s: it may not act, and the stream is over",
					nodeID, by, n.ExitedAt.UTC().Format(time.RFC3339)))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-signals:
		}
	}
}

// receiveSession handles the agent's messages until the stream ends.
func (a *agentService) receiveSession(ctx context.Context, stream *connect.BidiStream[tetherv1.SessionRequest, tetherv1.SessionResponse], p auth.Principal, out chan<- *tetherv1.SessionResponse) error {
	var lastWritten time.Time
	push := func(m *tetherv1.SessionResponse) error {
		select {
		case out <- m:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		msg, err := stream.Receive()
		if err != nil {
			if connect.CodeOf(err) == connect.CodeResourceExhausted {
				return err // the lineage's rate limit: the agent is told why
			}
			return nil // io.EOF, a cancel or a broken stream: the session is over
		}
		switch msg.Kind.(type) {
		case *tetherv1.SessionRequest_Heartbeat:
			// A terminated node's heartbeat is not acknowledged, and its
			// credential is never refreshed, whatever signal it missed; a
			// heartbeat after its exit was confirmed is refused and kept as
			// contradicting evidence.
			if _, err := a.s.agentAct(ctx, p.NodeID(), tree.ActivityHeartbeat, "a heartbeat on its session"); err != nil {
				return toConnect(err)
			}
			if lastWritten, err = a.s.tree.Heartbeat(ctx, p.NodeID(), lastWritten); err != nil {
				return toConnect(err)
			}
			now := a.s.cfg.Clock.Now()
			if err := push(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_HeartbeatAck{HeartbeatAck: &tetherv1.SessionHeartbeatAck{ServerTime: timestamppb.New(now)}}}); err != nil {
				return err
			}
			// Refresh the credential once a third of its life is left.
			if !p.ExpiresAt.IsZero() && p.ExpiresAt.Sub(now) < a.s.cfg.AgentCredentialTTL/3 {
				cred, exp, err := a.s.refreshAgent(ctx, p, now)
				if err != nil {
					return toConnect(err)
				}
				p.ExpiresAt = exp
				if err := push(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Credential{Credential: &tetherv1.SessionCredential{Credential: cred, ExpiresAt: timestamppb.New(exp)}}}); err != nil {
					return err
				}
			}
		case *tetherv1.SessionRequest_Exit:
			// The agent's own word: a claim. The session ends here, so the
			// control plane observes its end right after the claim.
			if _, err := a.s.tree.ConfirmExit(ctx, p.NodeID(), p.ID(), tree.ConfirmedBySelf, msg.GetExit().GetReason(), nil); err != nil {
				return toConnect(err)
			}
			return nil
		case *tetherv1.SessionRequest_Hello:
			return invalid("hello may be sent only once per session")
		default:
			return invalid("unknown session message")
		}
	}
}

// ConfirmExit: the agent itself, an ancestor agent, or an operator (a
// launcher, which observes the process from outside) confirms that the
// node's process has exited. The node's own word, or an ancestor's inside a
// subtree being stopped, is a claim; an operator's is an attestation. The
// record decides what either is worth against the control plane's own
// evidence (supervisor.judgeExit).
func (a *agentService) ConfirmExit(ctx context.Context, req *connect.Request[tetherv1.ConfirmExitRequest]) (*connect.Response[tetherv1.ConfirmExitResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	kind := tree.ConfirmedByLauncher
	authorize := func(n *tree.Node) error { return nil }
	if p.IsAgent() {
		kind = tree.ConfirmedBySelf
		if req.Msg.NodeId != p.NodeID() {
			kind = tree.ConfirmedByAncestor
			// Vouching for another node is activity: a node whose own exit
			// was confirmed may not (the interceptor lets only its own
			// ConfirmExit through), and the attempt is kept against it.
			if _, err := a.s.agentAct(ctx, p.NodeID(), tree.ActivityRequest, "a confirmation of another node's exit"); err != nil {
				return nil, toConnect(err)
			}
			authorize = func(n *tree.Node) error {
				if !tree.IsAncestor(n, p.NodeID()) {
					return fmt.Errorf("%w: agent %s may confirm only its own exit or a descendant's, not node_id %s", auth.ErrDenied, p.NodeID(), n.NodeID)
				}
				return nil
			}
		}
	}
	n, err := a.s.tree.ConfirmExit(ctx, req.Msg.NodeId, p.ID(), kind, req.Msg.Reason, authorize)
	if err != nil {
		return nil, toConnect(err)
	}
	// Before answering: the node's open lease channels on this replica
	// re-check it from their next message (other replicas learn it from
	// the store's watch).
	a.s.signals.NodeChanged(req.Msg.NodeId)
	return connect.NewResponse(&tetherv1.ConfirmExitResponse{Node: wire.Node(n)}), nil
}

// ProposeStop: an agent proposes its own stop; the control plane decides.
func (a *agentService) ProposeStop(ctx context.Context, req *connect.Request[tetherv1.ProposeStopRequest]) (*connect.Response[tetherv1.ProposeStopResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.NodeId != "" && req.Msg.NodeId != p.NodeID() {
		return nil, denied("agent %s may propose only its own stop, not node_id %s", p.NodeID(), req.Msg.NodeId)
	}
	mode := modeFromProto(req.Msg.Mode)
	prop, _, err := a.s.supervisor.Propose(ctx, p.NodeID(), req.Msg.Condition, req.Msg.Reason, p.ID(), mode,
		durationOr(req.Msg.DrainWindow, 0), a.s.cfg.StopPolicy)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ProposeStopResponse{Proposal: wire.Proposal(prop)}), nil
}

// WatchSignals is Session's signal half for clients without bidirectional
// streams (Connect over HTTP/1.1): the node, then at once the signal its
// state calls for, then each signal as the node's stored state changes.
// Like Session it is level-triggered (a reconnecting client is told the
// current state) and ends once the node is terminated.
func (a *agentService) WatchSignals(ctx context.Context, req *connect.Request[tetherv1.WatchSignalsRequest], stream *connect.ServerStream[tetherv1.WatchSignalsResponse]) error {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsAgent() {
		return denied("only an agent may watch its signals")
	}
	if req.Msg.NodeId != "" && req.Msg.NodeId != p.NodeID() {
		return denied("agent %s may watch only its own signals, not node_id %s", p.NodeID(), req.Msg.NodeId)
	}
	// A signals stream is a session in the exit evidence's sense: while it
	// is open the node is not gone, and its end is what corroborates the
	// agent's claim to have exited (as for Session).
	node, signals, closeSession, err := a.s.openSession(ctx, p.NodeID(), "signals stream")
	if err != nil {
		return err
	}
	defer closeSession()
	if err := stream.Send(&tetherv1.WatchSignalsResponse{Kind: &tetherv1.WatchSignalsResponse_Opened{Opened: &tetherv1.SessionOpened{Node: wire.Node(node)}}}); err != nil {
		return err
	}
	signal, resend, stopFollowing := a.s.signalsOut(ctx)
	defer stopFollowing()
	if sig := tree.SignalFor(node); sig != nil {
		if err := stream.Send(&tetherv1.WatchSignalsResponse{Kind: &tetherv1.WatchSignalsResponse_Signal{Signal: signal(sig)}}); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resend.wake:
			if sig := resend.again(); sig != nil {
				if err := stream.Send(&tetherv1.WatchSignalsResponse{Kind: &tetherv1.WatchSignalsResponse_Signal{Signal: signal(sig)}}); err != nil {
					return err
				}
			}
		case sig := <-signals:
			if err := stream.Send(&tetherv1.WatchSignalsResponse{Kind: &tetherv1.WatchSignalsResponse_Signal{Signal: signal(sig)}}); err != nil {
				return err
			}
			if err := a.s.sessionAlive(ctx, p.NodeID()); err != nil {
				return err
			}
		}
	}
}

// Heartbeat is Session's heartbeat as a unary call: last seen, the signal
// the node's state calls for, and a fresh credential once a third of the
// caller's is left.
func (a *agentService) Heartbeat(ctx context.Context, req *connect.Request[tetherv1.HeartbeatRequest]) (*connect.Response[tetherv1.HeartbeatResponse], error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsAgent() {
		return nil, denied("only an agent may send its heartbeat")
	}
	if req.Msg.NodeId != "" && req.Msg.NodeId != p.NodeID() {
		return nil, denied("agent %s may send only its own heartbeat, not node_id %s", p.NodeID(), req.Msg.NodeId)
	}
	if err := a.s.sessionAlive(ctx, p.NodeID()); err != nil {
		return nil, err
	}
	node, err := a.s.tree.Get(ctx, p.NodeID())
	if err != nil {
		return nil, toConnect(err)
	}
	// The stored last seen throttles the write as a session's memory does,
	// unless the session's end is the last the control plane saw of the
	// node: then this heartbeat is written, whatever the clock of the
	// replica that wrote last seen said (a rogue heartbeating on a replica
	// whose clock runs behind was throttled away).
	lastWritten := node.LastSeenAt
	if tree.SessionEndIsLastSeen(node) {
		lastWritten = time.Time{}
	}
	if _, err := a.s.tree.Heartbeat(ctx, p.NodeID(), lastWritten); err != nil {
		return nil, toConnect(err)
	}
	now := a.s.cfg.Clock.Now()
	resp := &tetherv1.HeartbeatResponse{ServerTime: timestamppb.New(now), Signal: a.s.signalOut(ctx, tree.SignalFor(node))}
	if !p.ExpiresAt.IsZero() && p.ExpiresAt.Sub(now) < a.s.cfg.AgentCredentialTTL/3 {
		cred, exp, err := a.s.refreshAgent(ctx, p, now)
		if err != nil {
			return nil, toConnect(err)
		}
		resp.Credential = &tetherv1.SessionCredential{Credential: cred, ExpiresAt: timestamppb.New(exp)}
	}
	return connect.NewResponse(resp), nil
}

// openSession subscribes to the node's signals and stores that a session
// opened (a stream whose being open says the node is not gone); it returns
// the node as stored then. closeSession stores the session's end, outliving
// ctx (the end must be stored), then unsubscribes; what names the stream in
// the log.
func (s *Server) openSession(ctx context.Context, nodeID, what string) (node *tree.Node, signals <-chan *tree.SessionSignal, closeSession func(), err error) {
	// Subscribe before reading the state: a change between the two is
	// then pushed rather than lost.
	signals, unsubscribe := s.signals.Subscribe(nodeID)
	node, closeStored, err := s.storeSession(ctx, nodeID, what)
	if err != nil {
		unsubscribe()
		return nil, nil, nil, err
	}
	return node, signals, func() {
		closeStored()
		unsubscribe()
	}, nil
}

// streamOpened stores that a stream of an agent's own credential that is
// not a session in the exit evidence's sense (its revocation feed, a
// termination watch) opened, and returns the function, deferred by its
// handler, that stores its end, outliving ctx. While one is open the
// control plane sees the node alive: a claim of the node's exit is not
// corroborated (tree.JudgeExit), and the end of the last, after the
// node's session's end, is the node seen after that end, in the same
// transaction (tree.StreamClosed). Until the twenty-ninth pass only the
// end was noted (tree.SeenAlive), a moment after the control plane ended
// the stream on the node's exit claim — or never, the replica serving it
// crashed — and the claim read confirmed in between. The node's streams
// on this process share one entry on the node (agentStreams): the first
// stores it before the stream's first message, the last's end removes it
// before its handler returns, so before the end reaches the agent.
// Callers other than agents store nothing.
func (s *Server) streamOpened(ctx context.Context) (closeStream func(), err error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsAgent() {
		return func() {}, nil
	}
	nodeID := p.NodeID()
	ns := s.streams.take(nodeID)
	ns.mu.Lock()
	if ns.open == 0 {
		ns.entry, err = s.tree.StreamOpened(ctx, nodeID)
		if err != nil {
			ns.mu.Unlock()
			s.streams.release(nodeID)
			return nil, toConnect(err)
		}
	}
	ns.open++
	ns.mu.Unlock()
	return func() {
		ns.mu.Lock()
		ns.open--
		if ns.open == 0 {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := s.tree.StreamClosed(closeCtx, nodeID, ns.entry); err != nil {
				// The entry stays: the node reads alive (unaccounted)
				// rather than gone.
				s.log.Warn("could not store the end of an agent's streams (revocation feeds, termination watches)", "node_id", nodeID, "error", err)
			}
			cancel()
		}
		ns.mu.Unlock()
		s.streams.release(nodeID)
	}, nil
}

// agentStreams counts, per node, the agent's streams on this process that
// are not sessions (streamOpened), which share one entry on the node.
type agentStreams struct {
	mu    sync.Mutex
	nodes map[string]*nodeStreams
}

// nodeStreams is one node's: mu is held across the store's writes of its
// entry, so a stream opening while the last one ends waits for the end's
// write and stores a new entry.
type nodeStreams struct {
	mu    sync.Mutex
	open  int    // streams open (under mu)
	entry string // the stored entry's id while open > 0 (under mu)
	refs  int    // holders of this struct (under agentStreams.mu)
}

func (a *agentStreams) take(nodeID string) *nodeStreams {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nodes == nil {
		a.nodes = map[string]*nodeStreams{}
	}
	ns := a.nodes[nodeID]
	if ns == nil {
		ns = &nodeStreams{}
		a.nodes[nodeID] = ns
	}
	ns.refs++
	return ns
}

func (a *agentStreams) release(nodeID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ns := a.nodes[nodeID]; ns != nil {
		if ns.refs--; ns.refs == 0 {
			delete(a.nodes, nodeID)
		}
	}
}

// storeSession stores that a stream whose being open says the node is not
// gone opened (a session in the exit evidence's sense, tree.SessionOpened)
// and returns the node as stored then; closeSession stores its end,
// outliving ctx. what names the stream in the log.
func (s *Server) storeSession(ctx context.Context, nodeID, what string) (node *tree.Node, closeSession func(), err error) {
	node, sessionID, err := s.tree.SessionOpened(ctx, nodeID)
	if err != nil {
		return nil, nil, toConnect(err)
	}
	return node, func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.tree.SessionClosed(closeCtx, nodeID, sessionID); err != nil {
			s.log.Warn("could not store the end of a "+what, "node_id", nodeID, "error", err)
		}
	}, nil
}
