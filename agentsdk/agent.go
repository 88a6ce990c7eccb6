package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Signal is a drain or abort order from the control plane.
type Signal struct {
	Abort         bool
	TerminationID string
	Reason        string
	// Deadline, on a drain, is when the stop next acts on its own, on the
	// control plane's clock (zero: the signal carried none): while it
	// drains, the end of its drain window (the calls still in flight are
	// then cancelled and the agent aborted); once the drain ended (every
	// call ended, at once for an agent with none) and its grants were
	// revoked, the end of its wait for the exit (the record is then
	// written and the credential refused: an exit not claimed by then is
	// unaccounted). It is the control plane's, read from the stop it
	// holds: the agent can stretch nothing by it. A stop's first drain
	// signal may come before it set one; a later signal (the node's next
	// change) carries it, and a stop that takes the node over sends its
	// own (DrainDeadline follows them). The abort may come sooner.
	Deadline time.Time
}

// Agent is one agent node: its credential, its session with the control
// plane, and the contexts that end when the control plane says so.
type Agent struct {
	conn *Conn
	// id never changes; node is replaced when a session opens (under mu).
	id   string
	node *tetherv1.Node

	// HeartbeatEvery is the session heartbeat interval (default 5s).
	HeartbeatEvery time.Duration

	mu        sync.Mutex
	onDrain   []func(Signal)
	onAbort   []func(Signal)
	drainOnce sync.Once
	abortOnce sync.Once
	draining  chan struct{}
	workCtx   context.Context
	abortWork context.CancelCauseFunc
	signal    Signal
	// drained and aborted: the signals arrived (under mu), with the
	// abort's; a callback registered after its signal runs at once.
	drained, aborted bool
	abortSignal      Signal
	// drainDeadline is the latest drain signal's Deadline (under mu).
	drainDeadline time.Time
	// abortRunning counts the OnAbort callbacks running, those an abort
	// started and those registered after it (under mu); abortIdle is
	// closed whenever it is back to zero. Run waits for it before it
	// returns its refusal.
	abortRunning int
	abortIdle    chan struct{}
	opened       chan struct{}
	openOnce     sync.Once
	// live is the open session, if any (Exit claims the exit over it, in
	// order after its heartbeats); exited stops Run from reconnecting.
	live   *liveSession
	exited bool
	// beating is closed when the heartbeat Run sends in place of a refused
	// session has been answered (nil: none under way); Exit claims after it.
	beating chan struct{}
}

// liveSession lets Exit hand its claim to the session's sender.
type liveSession struct {
	exit chan string   // Exit's reason, sent by the heartbeat goroutine
	done chan struct{} // closed when the session has ended
	// claimed, read once done is closed: the exit message was sent and the
	// session then ended cleanly, the control plane's answer to a claim it
	// stored (one it could not store ends the session with the error).
	claimed bool
	sent    atomic.Bool // the exit message was sent
}

// ErrAborted is the cause of an agent's context when the control plane
// aborts it.
var ErrAborted = errors.New("agentsdk: aborted by the control plane")

func newAgent(conn *Conn, node *tetherv1.Node) *Agent {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Agent{conn: conn, id: node.NodeId, node: node, draining: make(chan struct{}), workCtx: ctx, abortWork: cancel, opened: make(chan struct{})}
}

// RegisterRoot registers a root agent with an operator connection and
// returns it, connected with its own credential.
func RegisterRoot(ctx context.Context, operator *Conn, name string, labels map[string]string) (*Agent, error) {
	resp, err := operator.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name, Labels: labels}))
	if err != nil {
		return nil, err
	}
	return newAgent(Dial(operator.BaseURL, resp.Msg.Credential, WithHTTPClient(operator.HTTP), WithTimeout(operator.Timeout())), resp.Msg.Node), nil
}

// Child is a spawned child: its node and the credential to hand to the
// child's process (which calls Join).
type Child struct {
	Node       *tetherv1.Node
	Credential string
}

// Spawn registers a child under this agent. Refused once the agent is
// draining or aborting.
func (a *Agent) Spawn(ctx context.Context, name string, labels map[string]string) (Child, error) {
	resp, err := a.conn.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: a.id, Name: name, Labels: labels}))
	if err != nil {
		return Child{}, err
	}
	return Child{Node: resp.Msg.Node, Credential: resp.Msg.Credential}, nil
}

// ChildSpec is one child of SpawnBatch.
type ChildSpec struct {
	Name   string
	Labels map[string]string
}

// SpawnBatch registers up to 256 children under this agent in one call
// and one transaction, all or none, for fan-out; each has its own
// credential. It costs the rate budget of as many Spawn calls.
func (a *Agent) SpawnBatch(ctx context.Context, children []ChildSpec) ([]Child, error) {
	req := &tetherv1.SpawnBatchRequest{ParentNodeId: a.id, Children: make([]*tetherv1.SpawnBatchChild, len(children))}
	for i, c := range children {
		req.Children[i] = &tetherv1.SpawnBatchChild{Name: c.Name, Labels: c.Labels}
	}
	resp, err := a.conn.Agent.SpawnBatch(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	out := make([]Child, len(resp.Msg.Spawned))
	for i, s := range resp.Msg.Spawned {
		out[i] = Child{Node: s.Node, Credential: s.Credential}
	}
	return out, nil
}

// Join connects a spawned child's process with the credential its parent
// handed over. opts configure its connection as for Dial, after hc (a
// WithTimeout other than DefaultTimeout, for instance): every unary call
// of the agent whose context has no deadline ends at the connection's.
func Join(ctx context.Context, baseURL, credential string, hc *http.Client, opts ...Option) (*Agent, error) {
	conn := Dial(baseURL, credential, append([]Option{WithHTTPClient(hc)}, opts...)...)
	who, err := conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		return nil, err
	}
	if who.Msg.NodeId == "" {
		return nil, errors.New("agentsdk: Join needs an agent credential, not an operator token")
	}
	node, err := conn.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: who.Msg.NodeId}))
	if err != nil {
		return nil, err
	}
	return newAgent(conn, node.Msg.Node), nil
}

// Node is the agent's node as last seen.
func (a *Agent) Node() *tetherv1.Node {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.node
}

// NodeID is the agent's node id.
func (a *Agent) NodeID() string { return a.id }

// Conn is the agent's connection (its credential is the bearer token).
func (a *Agent) Conn() *Conn { return a.conn }

// Credential is the agent's current credential.
func (a *Agent) Credential() string { return a.conn.Token() }

// Context ends when the control plane aborts the agent (its cause is
// ErrAborted). Pass it to work that must stop on abort.
func (a *Agent) Context() context.Context { return a.workCtx }

// Draining is closed when the agent is told to drain or abort: finish what
// is in flight, start nothing new.
func (a *Agent) Draining() <-chan struct{} { return a.draining }

// DrainDeadline is the deadline of the drain the agent is under, as its
// latest drain signal gave it (Signal.Deadline; zero: none yet, or that
// signal carried none), on the control plane's clock: the first drain
// signal may have carried none, and a stop that takes the node over (an
// operator's drain over its parent's) sends its own.
func (a *Agent) DrainDeadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.drainDeadline
}

// OnDrain registers a callback run once when a drain (or abort) arrives,
// after Draining is closed, on a goroutine of the SDK's (the OnDrain
// callbacks on one, in the order registered): it may wait, for the work in
// flight or for Exit, and the session still hears an abort meanwhile.
//
// Registered after the drain arrived (a child that joins into its
// parent's stop hears it first thing), it runs at once, on a goroutine of
// its own.
func (a *Agent) OnDrain(f func(Signal)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.drained {
		go f(a.signal)
		return
	}
	a.onDrain = append(a.onDrain, f)
}

// OnAbort registers a callback run once when an abort arrives, after
// Context has ended, on a goroutine of the SDK's (the OnAbort callbacks on
// one, in the order registered, beside a drain's that may still run). Run
// returns its refusal of a dead credential once they have returned, also
// when the abort signal (not the refusal) started them.
//
// Registered after the abort arrived, it runs at once, on a goroutine of
// its own (and Run, refused then, waits for it too).
func (a *Agent) OnAbort(f func(Signal)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.aborted {
		done := a.abortCallbackStarted()
		go func() {
			defer done()
			f(a.abortSignal)
		}()
		return
	}
	a.onAbort = append(a.onAbort, f)
}

// abortCallbackStarted counts an OnAbort callback (or an abort's run of
// them) as running, with a.mu held, and returns what notes its return.
func (a *Agent) abortCallbackStarted() (returned func()) {
	if a.abortRunning == 0 {
		a.abortIdle = make(chan struct{})
	}
	a.abortRunning++
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.abortRunning--
		if a.abortRunning == 0 {
			close(a.abortIdle)
		}
	}
}

// abortCallbacksReturned is closed once no OnAbort callback runs.
func (a *Agent) abortCallbacksReturned() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.abortRunning == 0 {
		idle := make(chan struct{})
		close(idle)
		return idle
	}
	return a.abortIdle
}

// Opened is closed once the first session is open (the agent is then
// reachable by signals).
func (a *Agent) Opened() <-chan struct{} { return a.opened }

// handle applies a signal: it closes Draining and, on an abort, ends
// Context at once, then runs the callbacks on goroutines of their own
// (OnDrain's on one, OnAbort's on another, each in the order registered).
// The session's reading goes on meanwhile: a callback that waits (for the
// work in flight to finish, or for Exit, which waits for the session's
// end) held it before, and the abort that escalated the drain was never
// read, nor a refreshed credential (rogue36a test). It counts the
// OnAbort callbacks it starts as running (Run waits for them).
func (a *Agent) handle(sig *tetherv1.SessionSignal) {
	s := Signal{Abort: sig.Kind == tetherv1.SignalKind_SIGNAL_KIND_ABORT, TerminationID: sig.TerminationId, Reason: sig.Reason}
	if sig.Deadline != nil && !s.Abort {
		s.Deadline = sig.Deadline.AsTime()
	}
	if !s.Abort {
		// Every drain signal, not only the first: a stop that takes the
		// node over (an operator's over its parent's) drains it on its own
		// deadline, earlier or later (rogue37a test).
		a.mu.Lock()
		a.drainDeadline = s.Deadline
		a.mu.Unlock()
	}
	if hook := onSignal.Load(); hook != nil {
		(*hook)(a, s)
	}
	var drainFs, abortFs []func(Signal)
	var abortsReturned func()
	a.drainOnce.Do(func() {
		// Draining closes under a.mu, with drained set: an OnDrain that
		// finds drained runs at once, and must find Draining closed
		// (rogue37a test).
		a.mu.Lock()
		a.signal, a.drained = s, true
		drainFs, a.onDrain = a.onDrain, nil
		close(a.draining)
		a.mu.Unlock()
		if hook := afterSignalNoted.Load(); hook != nil {
			(*hook)(a, false)
		}
	})
	if s.Abort {
		a.abortOnce.Do(func() {
			// Likewise Context ends under a.mu, with aborted set.
			a.mu.Lock()
			a.abortSignal, a.aborted = s, true
			abortFs, a.onAbort = a.onAbort, nil
			if len(abortFs) > 0 {
				abortsReturned = a.abortCallbackStarted()
			}
			a.abortWork(ErrAborted)
			a.mu.Unlock()
			if hook := afterSignalNoted.Load(); hook != nil {
				(*hook)(a, true)
			}
		})
	}
	if len(drainFs) > 0 {
		go runCallbacks(drainFs, s, nil)
	}
	if len(abortFs) > 0 {
		go runCallbacks(abortFs, s, abortsReturned)
	}
}

// afterSignalNoted, set by tests only, runs in handle once it has noted a
// drain (abort false) or an abort (true) and released a.mu: a callback
// registered then is one registered after its signal.
var afterSignalNoted atomic.Pointer[func(a *Agent, abort bool)]

// runWaitsForAbortCallbacks, set by tests only, runs in Run once the
// credential (or the session) was refused and the abort noted, before Run
// waits for the OnAbort callbacks still running.
var runWaitsForAbortCallbacks atomic.Pointer[func(a *Agent)]

// onSignal, set by tests only, is told every signal handle reads, once
// DrainDeadline has taken it in.
var onSignal atomic.Pointer[func(a *Agent, s Signal)]

// runCallbacks calls fs with s in order, then calls done (if any).
func runCallbacks(fs []func(Signal), s Signal, done func()) {
	if done != nil {
		defer done()
	}
	for _, f := range fs {
		f(s)
	}
}

// Run keeps the agent's session open until ctx ends, reconnecting when the
// stream breaks, and applies the signals and refreshed credentials it
// receives. It returns nil when ctx ends or once the agent's own exit
// claim (Exit) was made. It returns the control plane's refusal, the
// agent's work aborted, when the credential is refused (unauthenticated,
// permission_denied: the node was terminated, which ends its credential,
// also after the agent was told so by a signal) or the session is, because
// the node's exit was confirmed (failed_precondition: a launcher's
// attestation); it returns that refusal once no OnAbort callback runs
// (those the abort signal started before the refusal included), so that a
// process that ends when Run returns has done its cleanup.
//
// A session refused for a bound (resource_exhausted: the node's open
// sessions, which whoever else holds its credential may hold, its signal
// streams, its lineage's) is followed by a unary heartbeat, whose answer
// carries the node's signal and a fresh credential as a session would.
//
// Before reconnecting it waits a backoff (100ms, doubling up to 5s), or
// the hint of a refusal that gives one (resource_exhausted: the lineage's
// rate limit), stretched as RetryPolicy's, at most MaxReconnectHint, when
// that is longer; the Conn's RetryPolicy (WithRetry) Wait and Jitter wait.
func (a *Agent) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		err := a.session(ctx)
		if ctx.Err() != nil || a.hasExited() {
			return nil
		}
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			// The session was refused for a bound: the node's open sessions
			// (held, maybe, by whoever else holds its credential: the
			// parent that spawned it keeps a copy), its signal streams, its
			// lineage's. Its signal still comes in a heartbeat's answer,
			// and so does a fresh credential: a rogue parent that held
			// every session its child may open had the child hear no stop
			// of its subtree, its work going on until its credential was
			// refused at the record (rogue40a test).
			if herr := a.heartbeat(ctx); endsRun(herr) {
				err = herr
			}
			if ctx.Err() != nil || a.hasExited() {
				return nil
			}
		}
		if connect.CodeOf(err) == connect.CodeUnauthenticated || connect.CodeOf(err) == connect.CodePermissionDenied {
			// The credential is dead (the node was terminated): nothing to
			// reconnect to. Make sure work stops.
			a.handle(&tetherv1.SessionSignal{Kind: tetherv1.SignalKind_SIGNAL_KIND_ABORT, Reason: "credential rejected: " + connect.CodeOf(err).String()})
			a.waitAbortCallbacks()
			return err
		}
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// The node's exit was confirmed (a launcher's attestation while
			// the agent was cut off): the control plane refuses its every
			// session and heartbeat, before the "stop now" it signals such
			// a node, so the refusal is that signal. Reconnecting, the agent
			// had each refusal stored as evidence against its exit, and its
			// work was never told to stop.
			a.handle(&tetherv1.SessionSignal{Kind: tetherv1.SignalKind_SIGNAL_KIND_ABORT, Reason: "the node's exit was confirmed: stop now"})
			a.waitAbortCallbacks()
			return err
		}
		// A refusal with a retry hint (the lineage's rate limit, spent) is
		// not tried again before the hint, stretched by up to half at
		// random as a unary call's retry is: reconnecting on the backoff
		// alone, an agent refused for its lineage's budget came back every
		// few seconds, each attempt refused until the budget refilled.
		wait := backoff
		if hint, ok := RetryHint(err); ok {
			wait = max(wait, a.conn.retry.stretch(min(hint, MaxReconnectHint)))
		}
		if (retrying{a.conn.retry}).sleep(ctx, wait) != nil {
			return nil
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// endsRun reports whether err, a session's or a heartbeat's, is a refusal
// Run returns: the credential is dead (unauthenticated,
// permission_denied) or the node's exit was confirmed
// (failed_precondition).
func endsRun(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeFailedPrecondition:
		return err != nil
	}
	return false
}

// heartbeat sends the unary heartbeat, in place of a session the control
// plane refused, and applies its answer: the node's signal and a fresh
// credential.
func (a *Agent) heartbeat(ctx context.Context) error {
	// Not after the exit claim (its activity would contradict it), and the
	// claim waits for it.
	a.mu.Lock()
	if a.exited {
		a.mu.Unlock()
		return nil
	}
	beating := make(chan struct{})
	a.beating = beating
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.beating = nil
		a.mu.Unlock()
		close(beating)
	}()
	resp, err := a.conn.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: a.id}))
	if err != nil {
		return err
	}
	a.refreshed(resp.Msg.GetCredential().GetCredential())
	if sig := resp.Msg.GetSignal(); sig != nil {
		a.handle(sig)
	}
	return nil
}

// refreshed takes the refreshed credential an answer carries (a session's
// message, a heartbeat's answer) when it could be one: a compact JWS
// within capability.MaxTokenBytes (capability.CompactJWS; the control
// plane's credentials are EdDSA JWTs). Any other (a proxy's, a hostile peer's) is
// not taken, the agent's own kept: one a header cannot carry (a line
// break, more than the control plane's 64 KiB of headers) failed every
// later session and heartbeat in the agent's own transport or at the
// server's headers, for good once the path was honest again, and the
// agent never heard its stop; one the control plane refuses at sight (a
// space) had the agent abort itself, a stop nobody ordered (rogue41I
// test).
func (a *Agent) refreshed(c string) {
	if !capability.CompactJWS(c) {
		return
	}
	a.conn.SetToken(c)
}

// waitAbortCallbacks waits until no OnAbort callback runs: those this
// refusal's abort started, and those the session's abort signal started
// before it (rogue39a test: Run returned at once, the abort signal had
// already started them, and an agent whose process ends when Run returns
// ended in the middle of its cleanup), or an OnAbort registered since.
func (a *Agent) waitAbortCallbacks() {
	if hook := runWaitsForAbortCallbacks.Load(); hook != nil {
		(*hook)(a)
	}
	<-a.abortCallbacksReturned()
}

// afterExitSent, set by tests only, runs in a session's writer between
// the exit message's Send and the note that it was sent (the session's
// end read before that note).
var afterExitSent atomic.Pointer[func(session context.Context)]

func (a *Agent) hasExited() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exited
}

// MaxUnansweredHeartbeats is how many of a session's heartbeats in a row
// may go unanswered before the agent takes the session for dead, ends it
// and opens another. The control plane answers each heartbeat (its
// acknowledgement), so a session that carries none back for that many
// intervals is stalled on the way (a proxy's, a hostile peer's): the
// agent waited on such a stream for good, deaf to its node's stop once
// the path was honest again (rogue42j test).
const MaxUnansweredHeartbeats = 3

// errSessionSilent ends a session whose heartbeats went unanswered.
var errSessionSilent = connect.NewError(connect.CodeUnavailable, fmt.Errorf("agentsdk: the session carried nothing back for %d heartbeats; opening another", MaxUnansweredHeartbeats))

func (a *Agent) session(ctx context.Context) (err error) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	defer cancel()
	// unanswered counts the heartbeats sent since the session last
	// carried a message back.
	var unanswered atomic.Int32
	live := &liveSession{exit: make(chan string), done: make(chan struct{})}
	a.mu.Lock()
	if a.exited {
		a.mu.Unlock()
		return nil // the exit was claimed: a new session would contradict it
	}
	a.live = live
	a.mu.Unlock()
	var writing chan struct{} // closed when the writer has returned
	defer func() {
		a.mu.Lock()
		if a.live == live {
			a.live = nil
		}
		a.mu.Unlock()
		// A clean end (Receive's io.EOF) after the exit message: the
		// control plane stored the claim and ended the session. Whether
		// the message was sent is read once the writer has returned: the
		// end can come before the writer notes it. (Cancelling ctx ends
		// the writer; Receive's error path has done so already.)
		if writing != nil {
			cancel()
			<-writing
		}
		live.claimed = live.sent.Load() && errors.Is(err, io.EOF)
		close(live.done)
	}()
	stream := a.conn.Agent.Session(ctx)
	// Unblock Receive when ctx ends: a bidi stream's Receive does not
	// always observe the context on its own.
	stop := context.AfterFunc(ctx, func() {
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
	})
	defer stop()
	if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: a.id}}}); err != nil {
		// The control plane may answer before the hello is written (a
		// refusal at the stream's open: the lineage's rate limit, a dead
		// credential): Send then fails with io.EOF, and the refusal is
		// Receive's. Run decides by that refusal's code and hint; it read
		// "unknown: write envelope: EOF", and reconnected on its backoff.
		if errors.Is(err, io.EOF) {
			if _, rerr := stream.Receive(); rerr != nil {
				return rerr
			}
		}
		return err
	}
	every := a.HeartbeatEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	errc := make(chan error, 1)
	writing = make(chan struct{})
	go func() {
		defer close(writing)
		ticker := time.NewTicker(every)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				errc <- nil
				return
			case reason := <-live.exit:
				// The claim travels behind every heartbeat already sent;
				// the control plane ends the session after it.
				err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Exit{Exit: &tetherv1.SessionExit{Reason: reason}}})
				if hook := afterExitSent.Load(); hook != nil {
					(*hook)(ctx)
				}
				live.sent.Store(err == nil)
				errc <- err
				return
			case <-ticker.C:
				if unanswered.Add(1) > MaxUnansweredHeartbeats {
					cancelCause(errSessionSilent)
					errc <- errSessionSilent
					return
				}
				if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	for {
		msg, err := stream.Receive()
		if err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, errSessionSilent) {
				err = cause
			}
			cancel()
			_ = stream.CloseRequest()
			return err
		}
		unanswered.Store(0)
		switch k := msg.Kind.(type) {
		case *tetherv1.SessionResponse_Opened:
			a.mu.Lock()
			a.node = k.Opened.Node
			a.mu.Unlock()
			a.openOnce.Do(func() { close(a.opened) })
		case *tetherv1.SessionResponse_Signal:
			a.handle(k.Signal)
		case *tetherv1.SessionResponse_Credential:
			a.refreshed(k.Credential.GetCredential())
		}
	}
}

// Exit claims the agent's own exit and ends its session; call it last: from
// then on the control plane refuses the agent's credential, and anything
// the agent still sends is recorded as contradicting its claim (the
// termination record then says the node is unaccounted). The claim goes
// over the open session when there is one, behind its heartbeats, so that
// it is the session's last word; otherwise by ConfirmExit, and by
// ConfirmExit as well when that session ends with an error rather than
// the control plane's clean end after a claim it stored (a claim already
// stored is not changed by another). A claim counts
// in the record only when the control plane's own evidence agrees; a
// launcher's confirmation (ConfirmExit with an operator token, after the
// process ended) is an attestation.
func (a *Agent) Exit(ctx context.Context, reason string) error {
	a.mu.Lock()
	a.exited = true
	live, beating := a.live, a.beating
	a.mu.Unlock()
	if beating != nil {
		// A heartbeat in place of a refused session: the claim goes after it.
		select {
		case <-beating:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if live != nil {
		select {
		case live.exit <- reason:
			select {
			case <-live.done:
				if live.claimed {
					return nil
				}
				// The session ended with an error, or before the claim
				// went out: the claim may never have been stored. Claim by
				// RPC (a claim already stored changes nothing).
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-live.done: // the session ended first: claim by RPC
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, err := a.conn.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: a.id, Reason: reason}))
	return err
}

// ProposeStop proposes the agent's own stop; the control plane decides.
func (a *Agent) ProposeStop(ctx context.Context, condition, reason string) (*tetherv1.StopProposal, error) {
	resp, err := a.conn.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: a.id, Condition: condition, Reason: reason}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Proposal, nil
}

// StopRule describes a stop rule to attach (see docs/stop-rules.md).
type StopRule struct {
	// Name is unique among the rules in effect at the node.
	Name string
	// Expression is CEL of type bool over `observed` (what the control
	// plane observed of the node) and `self_reported` (ReportCounters).
	Expression string
	// Action is a hint: "propose" (default), "drain" or "abort". The
	// operator's policy decides.
	Action      string
	Severity    string
	Labels      map[string]string
	Description string
}

// AddStopRule attaches a stop rule to this agent's own node (nodeID "")
// or to one of its descendants. The agent writes when it should stop; the
// control plane evaluates the rule against what it observes and, when it
// becomes true, files a stop proposal that the operator's policy decides.
// The rule binds the agent's whole subtree, and neither the agent's
// descendants nor the agent itself can loosen a rule its ancestors or
// operators set. A malformed or too costly expression is refused with
// its position.
func (a *Agent) AddStopRule(ctx context.Context, nodeID string, r StopRule) (*tetherv1.StopRule, error) {
	if nodeID == "" {
		nodeID = a.id
	}
	resp, err := a.conn.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: nodeID, Name: r.Name, Expression: r.Expression, Action: r.Action,
		Severity: r.Severity, Labels: r.Labels, Description: r.Description,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Rule, nil
}

// StopRules lists the rules in effect at the agent's node, inherited
// ones included, reading every page (each a request of the tree's
// budget).
func (a *Agent) StopRules(ctx context.Context) ([]*tetherv1.StopRule, error) {
	var out []*tetherv1.StopRule
	token := ""
	for {
		resp, err := a.conn.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: a.id, PageToken: token}))
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Msg.Rules...)
		if token = resp.Msg.NextPageToken; token == "" {
			return out, nil
		}
	}
}

// ReportCounters reports counters about this agent (cost, tokens, ...);
// each value replaces the counter's earlier one. Rules read them as
// `self_reported`, and every proposal and record labels them
// self-reported: they are the agent's word, not the control plane's
// observation.
func (a *Agent) ReportCounters(ctx context.Context, counters map[string]float64) error {
	_, err := a.conn.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: a.id, Counters: counters}))
	return err
}

// Grant is a capability grant with its current token.
type Grant struct {
	*tetherv1.Grant
	Token     string
	ExpiresAt time.Time
}

// Delegate derives a narrower grant from one the agent holds for a node in
// its subtree.
func (a *Agent) Delegate(ctx context.Context, parentGrantID, childNodeID string, scopes []string, ttl time.Duration) (Grant, error) {
	req := &tetherv1.DelegateRequest{ParentGrantId: parentGrantID, HolderNodeId: childNodeID, Scopes: scopes}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := a.conn.Capability.Delegate(ctx, connect.NewRequest(req))
	if err != nil {
		return Grant{}, err
	}
	return Grant{Grant: resp.Msg.Grant, Token: resp.Msg.Token, ExpiresAt: resp.Msg.TokenExpiresAt.AsTime()}, nil
}

// RefreshToken mints a fresh short-lived token for a grant the agent holds;
// the control plane re-checks the whole chain first.
func (a *Agent) RefreshToken(ctx context.Context, grantID string) (Grant, error) {
	resp, err := a.conn.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: grantID}))
	if err != nil {
		return Grant{}, err
	}
	return Grant{Grant: resp.Msg.Grant, Token: resp.Msg.Token, ExpiresAt: resp.Msg.TokenExpiresAt.AsTime()}, nil
}

// String describes the agent.
func (a *Agent) String() string { return fmt.Sprintf("%s (%s)", a.Node().Name, a.id) }
