package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Fault injection through the real server: what clients, workers, agents
// and sinks do wrong in production, and what the control plane does about
// it. (A tool gate that never acknowledges a cancel is
// TestAbortAgainstAGateThatNeverAcksRecordsCancelUnacknowledged.)

// droppable is an HTTP/2 cleartext client whose TCP connections the test
// can cut, as a crashed client or a broken network would.
type droppable struct {
	*http.Client
	mu    sync.Mutex
	conns []net.Conn
}

func newDroppable() *droppable {
	d := &droppable{}
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	dialer := &net.Dialer{}
	d.Client = &http.Client{Transport: &http.Transport{Protocols: p, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.conns = append(d.conns, c)
			d.mu.Unlock()
		}
		return c, err
	}}}
	return d
}

// drop closes every connection at the TCP level.
func (d *droppable) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}

// TestDisconnectedStreamsAreCleanedUp opens every kind of long-lived
// stream — Session, Channel, WatchCancels, WatchRevocations,
// WatchTermination — from many clients, waits until each is established
// (it delivered its first message), then makes the clients vanish: half
// abandon their calls (cancel and reset their streams), half lose their
// TCP connections. The server must
// end every handler and everything it started for them: the process's
// goroutine count comes back to where it was.
func TestDisconnectedStreamsAreCleanedUp(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	bg := context.Background()

	// Something for each watch to show at once: a termination in progress
	// (a drain with an hour's window), and a cancel order pending on a
	// gate (an abort waiting an hour for the ack).
	victim := register(t, admin, "victim")
	watched := terminate(t, admin, victim.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	busy := register(t, admin, "busy")
	g, err := admin.Capability.IssueRoot(bg, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: busy.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	gateToken := srv.ToolServerToken(t, "leak-gate")
	if _, err := srv.Clients(gateToken).Tool.BeginCall(bg, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Msg.Token, Tool: "shell", GateId: "leak-gate"})); err != nil {
		t.Fatal(err)
	}
	aborted := terminate(t, admin, busy.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour, time.Hour)
	testserver.WaitFor(t, 10*time.Second, "the cancel order", func() bool {
		return getTermination(t, admin, aborted.TerminationId).Progress.GetAcksPending() == 1
	})

	// client opens the five streams over its own connections and returns
	// once each delivered its first message.
	type client struct {
		hc     *droppable
		cancel context.CancelFunc
		// abandon: the client cancels its calls and closes its streams (a
		// bidi stream's request side stays open until the client closes
		// it; HTTP/2 cannot tell an abandoned stream from an idle one).
		abandon func()
	}
	open := func(t *testing.T, i int) client {
		t.Helper()
		agent := register(t, admin, fmt.Sprintf("streamer-%d", i))
		hc := newDroppable()
		ctx, cancel := context.WithCancel(bg)
		asAdmin := testserver.NewClients(hc.Client, srv.URL, srv.Admin)
		asGate := testserver.NewClients(hc.Client, srv.URL, gateToken)
		asAgent := testserver.NewClients(hc.Client, srv.URL, agent.Credential)
		var firsts sync.WaitGroup
		first := func(name string, receive func() error) {
			firsts.Add(1)
			go func() {
				defer firsts.Done()
				if err := receive(); err != nil {
					t.Errorf("%s %d: %v", name, i, err)
				}
			}()
		}
		session := asAgent.Agent.Session(ctx)
		first("session", func() error {
			if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: agent.Node.NodeId}}}); err != nil {
				return err
			}
			_, err := session.Receive()
			return err
		})
		channel := asAgent.Lease.Channel(ctx)
		first("channel", func() error {
			// A message about a job that has no lease: judged, answered.
			if err := channel.Send(renew(&tetherv1.Lease{JobId: "no-such-job", LeaseId: "l", LeaseGeneration: 1}, 1)); err != nil {
				return err
			}
			_, err := channel.Receive()
			return err
		})
		server := func(name string, call func() (interface {
			Receive() bool
			Err() error
		}, error)) {
			first(name, func() error {
				s, err := call()
				if err != nil {
					return err
				}
				if !s.Receive() {
					return fmt.Errorf("no first message: %v", s.Err())
				}
				return nil
			})
		}
		server("watch cancels", func() (interface {
			Receive() bool
			Err() error
		}, error) {
			return asGate.Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "leak-gate"}))
		})
		server("watch revocations", func() (interface {
			Receive() bool
			Err() error
		}, error) {
			return asAgent.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		})
		server("watch termination", func() (interface {
			Receive() bool
			Err() error
		}, error) {
			return asAdmin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: watched.TerminationId}))
		})
		firsts.Wait()
		abandon := func() {
			cancel()
			_ = session.CloseResponse()
			_ = channel.CloseResponse()
		}
		return client{hc: hc, cancel: cancel, abandon: abandon}
	}

	// Warm up (connection pools, lazily started watchers), then measure.
	warm := open(t, -1)
	warm.abandon()
	warm.hc.drop()
	settled := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	var base int
	testserver.WaitFor(t, 20*time.Second, "the warm-up streams to end", func() bool {
		n := settled()
		ok := base != 0 && n <= base
		base = n
		return ok
	})

	const clients = 12
	var all []client
	for i := range clients {
		all = append(all, open(t, i))
	}
	during := settled()
	if during < base+clients*5 {
		t.Fatalf("%d goroutines with %d clients' streams open, from %d: the streams are not being served", during, clients, base)
	}
	for i, c := range all {
		if i%2 == 0 {
			c.abandon() // the client gives up: RST_STREAM
		} else {
			c.hc.drop() // the client dies: the connection is gone
		}
	}
	const tolerance = 8
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, c := range all {
			c.hc.CloseIdleConnections()
		}
		n := settled()
		if n <= base+tolerance {
			break
		}
		if time.Now().After(deadline) {
			var stacks strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			t.Fatalf("%d goroutines 30s after the clients went away, from %d with them and %d before (tolerance %d):\n%s", n, during, base, tolerance, stacks.String())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition another goroutine makes true
	}
	for _, c := range all {
		c.cancel()
	}
	// The server still serves: nothing was left holding a lock.
	if _, err := admin.Agent.GetNode(bg, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: victim.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicatedAndReorderedLeaseMessages: a worker's retries deliver every
// renew and progress twice, at the same time, over two transports (unary
// and the Channel stream), and in shuffled order. Each sequence is
// accepted exactly once, the duplicate gets an explicit audit outcome
// (DUPLICATE_RENEW, DUPLICATE_PROGRESS) and changes nothing, a late lower
// sequence never regresses the lease, and the final authority is what the
// in-order history gives.
func TestDuplicatedAndReorderedLeaseMessages(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	l := w.offer(t, w.job(), w.w1, time.Minute)
	l, d := unary{w.w1C}.send(t, ack(l))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)

	stream := w.w1C.Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	viaChannel := func(m *tetherv1.ChannelRequest, correlation uint64) (*tetherv1.Decision, error) {
		m.CorrelationId = correlation
		if err := stream.Send(m); err != nil {
			return nil, err
		}
		resp, err := stream.Receive()
		if err != nil {
			return nil, err
		}
		if resp.Error != "" {
			return nil, fmt.Errorf("channel: %s", resp.Error)
		}
		return resp.Decision, nil
	}
	viaUnary := func(m *tetherv1.ChannelRequest) (*tetherv1.Decision, error) {
		switch m := m.Message.(type) {
		case *tetherv1.ChannelRequest_Renew:
			r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(m.Renew))
			if err != nil {
				return nil, err
			}
			return r.Msg.Decision, nil
		case *tetherv1.ChannelRequest_Progress:
			r, err := w.w1C.Lease.Progress(ctx, connect.NewRequest(m.Progress))
			if err != nil {
				return nil, err
			}
			return r.Msg.Decision, nil
		}
		return nil, fmt.Errorf("unexpected %T", m.Message)
	}

	const n = 12
	var msgs []*tetherv1.ChannelRequest
	for s := uint64(1); s <= n; s++ {
		msgs = append(msgs, renew(l, s), progress(l, s, fmt.Sprintf("step-%d", s)))
	}
	// Shuffled, deterministically: odd positions first, then even, in
	// reverse — every message arrives out of order.
	var order []*tetherv1.ChannelRequest
	for i := len(msgs) - 1; i >= 0; i -= 2 {
		order = append(order, msgs[i])
	}
	for i := len(msgs) - 2; i >= 0; i -= 2 {
		order = append(order, msgs[i])
	}
	outcomes := map[tetherv1.Outcome]int{}
	events := map[tetherv1.AuditEvent]int{}
	for i, m := range order {
		var (
			wg     sync.WaitGroup
			d1, d2 *tetherv1.Decision
			e1, e2 error
		)
		wg.Add(2)
		go func() { defer wg.Done(); d1, e1 = viaUnary(m) }()
		go func() { defer wg.Done(); d2, e2 = viaChannel(m, uint64(i+1)) }()
		wg.Wait()
		if e1 != nil || e2 != nil {
			t.Fatalf("message %d: unary %v, channel %v", i, e1, e2)
		}
		accepted := 0
		for _, d := range []*tetherv1.Decision{d1, d2} {
			outcomes[d.Outcome]++
			events[d.AuditEvent]++
			if d.Outcome == tetherv1.Outcome_OUTCOME_ACCEPTED {
				accepted++
			}
		}
		if accepted > 1 {
			t.Fatalf("message %d was accepted twice: %v / %v", i, d1, d2)
		}
	}
	got := w.get(t, l.JobId)
	if got.RenewSequence != n || got.ProgressSequence != n || got.ProgressValue != fmt.Sprintf("step-%d", n) || got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
		t.Fatalf("after duplicated, reordered delivery: renew %d progress %d %q %s, want %d, %d, step-%d, ACTIVE",
			got.RenewSequence, got.ProgressSequence, got.ProgressValue, got.State, n, n, n)
	}
	// The highest renew and the highest progress are accepted (they were
	// delivered first); every other delivery is a duplicate or late.
	if outcomes[tetherv1.Outcome_OUTCOME_ACCEPTED] < 2 || events[tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW] < 1 || events[tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS] < 1 {
		t.Fatalf("outcomes %v, events %v: want accepted messages, and duplicates named as such", outcomes, events)
	}
	// Every delivery is in the evidence, with its outcome.
	rows := w.evidence(t, l.JobId)
	if judged := len(rows) - 2; judged != 2*len(msgs) {
		t.Fatalf("%d evidence rows for %d deliveries (plus offer and ack)", judged, 2*len(msgs))
	}
	for _, r := range rows {
		if r.Decision.Outcome == tetherv1.Outcome_OUTCOME_DUPLICATE && !strings.Contains(r.Reason, "nothing changed") && !strings.Contains(r.Reason, "repeats") {
			t.Fatalf("a duplicate's evidence row does not say it changed nothing: %q", r.Reason)
		}
	}
}

// TestAgentThatHeartbeatsButIgnoresTheDrain: a heartbeat is not an exit
// confirmation. An agent that keeps its session and heartbeats but never
// honours the drain signal is unaccounted in the record, with when it was
// last seen; its session ends and its credential dies with the
// termination.
func TestAgentThatHeartbeatsButIgnoresTheDrain(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rogue := register(t, admin, "rogue")
	session := srv.Clients(rogue.Credential).Agent.Session(ctx)
	defer func() { _ = session.CloseRequest(); _ = session.CloseResponse() }()
	if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: rogue.Node.NodeId}}}); err != nil {
		t.Fatal(err)
	}
	responses := make(chan *tetherv1.SessionResponse, 64)
	receiveErr := make(chan error, 1)
	go func() {
		for {
			resp, err := session.Receive()
			if err != nil {
				receiveErr <- err
				close(responses)
				return
			}
			responses <- resp
		}
	}()
	next := func(what string, match func(*tetherv1.SessionResponse) bool) *tetherv1.SessionResponse {
		t.Helper()
		for resp := range responses {
			if match(resp) {
				return resp
			}
		}
		t.Fatalf("the session ended before %s: %v", what, <-receiveErr)
		return nil
	}
	heartbeat := func() {
		t.Helper()
		if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{SentAt: timestamppb.New(clk.Now())}}}); err != nil {
			t.Fatal(err)
		}
		next("a heartbeat ack", func(r *tetherv1.SessionResponse) bool { return r.GetHeartbeatAck() != nil })
	}
	next("opened", func(r *tetherv1.SessionResponse) bool { return r.GetOpened() != nil })
	heartbeat()

	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 5*time.Second, 30*time.Second)
	sig := next("the drain signal", func(r *tetherv1.SessionResponse) bool { return r.GetSignal() != nil }).GetSignal()
	if sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_DRAIN || sig.TerminationId != term.TerminationId {
		t.Fatalf("signal %v, want a drain for %s", sig, term.TerminationId)
	}
	// It ignores the drain and keeps heartbeating, up to the confirm
	// timeout (30s), then past it.
	var lastSeen time.Time
	for range 5 {
		clk.Advance(5 * time.Second)
		lastSeen = clk.Now()
		heartbeat()
	}
	// With no call in flight the drain ends and it reconciles: its
	// confirm timeout runs from the revocation, so the clock moves past it
	// only once the revocation is there (waitState waits for it; a
	// reconciler that fell behind the clock would otherwise start that
	// timeout late and wait on).
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(time.Minute)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, done.TerminationId)
	if len(rec.Nodes) != 1 || rec.Nodes[0].Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("record nodes %v, want the rogue unaccounted", rec.Nodes)
	}
	if seen := rec.Nodes[0].LastSeenAt.AsTime(); seen.Before(lastSeen.Add(-time.Minute)) {
		t.Fatalf("last seen %s, want about its last heartbeat %s", seen, lastSeen)
	}
	// Its session is over: the control plane stops serving a terminated
	// node's session (a heartbeat is refused, the stream ends).
	_ = session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{SentAt: timestamppb.New(clk.Now())}}})
	for resp := range responses {
		if resp.GetHeartbeatAck() != nil {
			t.Fatal("the terminated agent's heartbeat was acknowledged")
		}
	}
	if err := <-receiveErr; connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the terminated agent's session ended with %v, want unauthenticated", err)
	}
	if _, err := srv.Clients(rogue.Credential).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the rogue's credential after the termination: %v, want unauthenticated", err)
	}
}

// TestWorkerClockHoursOff: a worker whose clock is five hours off stamps
// sent_at accordingly. Authority is decided on the coordinator's clock:
// the skew is noted in the reason, the expiry is the coordinator's receipt
// time plus the lease duration, and a renew that claims (by sent_at) to
// have been sent before the expiry but arrives after it is refused.
func TestWorkerClockHoursOff(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	l := w.offer(t, w.job(), w.w1, 30*time.Second)
	skewNoted := func(what string, d *tetherv1.Decision) {
		t.Helper()
		if !strings.Contains(d.Reason, "sent_at") || !strings.Contains(d.Reason, "evidence only") {
			t.Fatalf("%s: the reason does not note the skew: %q", what, d.Reason)
		}
	}

	// An ACK stamped five hours in the future.
	a, err := w.w1C.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1,
		SentAt: timestamppb.New(w.clock.Now().Add(5 * time.Hour))}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "an ack from the future", a.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	skewNoted("the ack", a.Msg.Decision)
	if got, want := a.Msg.Lease.ExpiresAt.AsTime(), w.clock.Now().Add(30*time.Second); !got.Equal(want) {
		t.Fatalf("expiry after the ack %s, want the coordinator's receipt time + 30s = %s", got, want)
	}

	// A renew stamped five hours in the past.
	w.clock.Advance(10 * time.Second)
	now := w.clock.Now()
	r, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1, RenewSequence: 1,
		SentAt: timestamppb.New(now.Add(-5 * time.Hour))}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "a renew from the past", r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	skewNoted("the renew", r.Msg.Decision)
	expiry := r.Msg.Lease.ExpiresAt.AsTime()
	if want := now.Add(30 * time.Second); !expiry.Equal(want) {
		t.Fatalf("expiry after the renew %s, want the coordinator's receipt time + 30s = %s", expiry, want)
	}

	// The lease expires on the coordinator's clock. A renew that arrives
	// after that, claiming by its sent_at to have been sent well before,
	// is refused: the generation is not revived.
	w.clock.Set(expiry.Add(time.Second))
	late, err := w.w1C.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1, RenewSequence: 2,
		SentAt: timestamppb.New(expiry.Add(-20 * time.Second))}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "a late renew claiming an early sent_at", late.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	if got := w.get(t, l.JobId); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.RenewSequence != 1 {
		t.Fatalf("after the late renew: %s renew %d, want EXPIRED at renew 1", got.State, got.RenewSequence)
	}
}

// TestRecordSinkDownThenRecovering: the record webhook answers 503. The
// termination still completes and its record is persisted and readable at
// once; delivery is retried, survives a restart of the control plane, and
// succeeds when the sink recovers — with the record that was persisted.
func TestRecordSinkDownThenRecovering(t *testing.T) {
	var (
		healthy   atomic.Bool
		failures  atomic.Int64
		delivered = make(chan string, 16)
	)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !healthy.Load() {
			failures.Add(1)
			http.Error(w, "sink down", http.StatusServiceUnavailable)
			return
		}
		var rec struct {
			RecordID string `json:"recordId"`
		}
		if err := json.Unmarshal(body, &rec); err != nil || rec.RecordID == "" {
			http.Error(w, "bad record", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		delivered <- rec.RecordID
	}))
	defer sink.Close()
	withSink := func(cfg *controlplane.Config) {
		cfg.RecordWebhook = sink.URL
		cfg.RecordRetry = 10 * time.Millisecond
	}
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, withSink)
	admin := srv.AdminClients()
	node := register(t, admin, "short-lived")
	term := terminate(t, admin, node.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, done.TerminationId) // persisted, whatever the sink says
	testserver.WaitFor(t, 20*time.Second, "delivery attempts against the failing sink", func() bool { return failures.Load() >= 2 })

	// The control plane restarts while the sink is still down.
	srv.Stop()
	before := failures.Load()
	srv = testserver.StartIn(t, dir, withSink)
	testserver.WaitFor(t, 20*time.Second, "the restarted outbox to retry", func() bool { return failures.Load() > before })
	if again := record(t, srv.AdminClients(), done.TerminationId); again.RecordId != rec.RecordId {
		t.Fatalf("after the restart the record is %s, want %s", again.RecordId, rec.RecordId)
	}

	healthy.Store(true)
	select {
	case id := <-delivered:
		if id != rec.RecordId {
			t.Fatalf("the sink received record %s, want %s", id, rec.RecordId)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the record was not delivered after the sink recovered (%d failed attempts)", failures.Load())
	}
}
