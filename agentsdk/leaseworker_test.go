package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

var leaseEpoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// cuttable is an HTTP transport a test can disconnect.
type cuttable struct {
	next http.RoundTripper
	cut  atomic.Bool
	// inFlight is held (read) by each exchange from its request until
	// its response's headers: disconnect waits for those begun before it.
	inFlight sync.RWMutex
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	c.inFlight.RLock()
	defer c.inFlight.RUnlock()
	if c.cut.Load() {
		return nil, errors.New("network unreachable (test)")
	}
	return c.next.RoundTrip(r)
}

// disconnect cuts the network once every exchange already on it has had
// its answer: none sent before the cut reaches the server after it (where
// the test's clock may have moved on), and none sent after does.
func (c *cuttable) disconnect() {
	c.inFlight.Lock()
	c.cut.Store(true)
	c.inFlight.Unlock()
}

type leaseSetup struct {
	srv     *testserver.Server
	clock   *clock.Manual
	planner *agentsdk.Conn
	worker  *agentsdk.Conn
	node    string
	net     *cuttable
}

func newLeaseSetup(t testing.TB) *leaseSetup {
	t.Helper()
	var net *cuttable
	s, _ := newLeaseSetupVia(t, func(rt http.RoundTripper) http.RoundTripper {
		net = &cuttable{next: rt}
		return net
	})
	s.net = net
	return s
}

// newLeaseSetupVia starts the server, a planner and its worker, whose
// connection goes through the transport wrap builds over the test
// server's; it also returns the worker's credential, for another process
// of the same agent.
func newLeaseSetupVia(t testing.TB, wrap func(http.RoundTripper) http.RoundTripper) (*leaseSetup, string) {
	t.Helper()
	clk := clock.NewManual(leaseEpoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	planner := agentsdk.Dial(srv.URL, root.Msg.Credential, agentsdk.WithHTTPClient(srv.HTTP))
	child, err := planner.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	worker := agentsdk.Dial(srv.URL, child.Msg.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: wrap(testserver.H2CClient().Transport)}))
	return &leaseSetup{srv: srv, clock: clk, planner: planner, worker: worker, node: child.Msg.Node.NodeId}, child.Msg.Credential
}

func (s *leaseSetup) offer(t testing.TB, job string, d time.Duration) *tetherv1.Lease {
	t.Helper()
	resp, err := s.planner.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: s.node, LeaseDuration: durationpb.New(d)}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Lease
}

func (s *leaseSetup) get(t *testing.T, job string) *tetherv1.Lease {
	t.Helper()
	resp, err := s.planner.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Lease
}

// loopRenewEvery is the renew loop's tick for a test that waits for the
// answer to one of the loop's renewals (a refusal, a cancel request): the
// tick is also each renewal's deadline, so it is a guard against an answer
// that never comes, not a timing — a second, not the 5 ms a loaded
// machine's answers exceed, with which every renewal failed
// deadline_exceeded and the job never heard the answer it waited for.
const loopRenewEvery = time.Second

func (s *leaseSetup) newWorker(t testing.TB, dir string, every time.Duration) *agentsdk.LeaseWorker {
	t.Helper()
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: dir, Clock: s.clock, RenewEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func accepted(t *testing.T, what string, d *tetherv1.Decision, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if d.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
		t.Fatalf("%s: %s %s", what, d.AuditEvent, d.Reason)
	}
}

func TestLeaseWorkerAcksRenewsReportsAndHandlesCancel(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour) // renewals driven by the test
	ctx := context.Background()
	cancelled := make(chan *tetherv1.Lease, 1)
	job, d, err := w.Accept(ctx, s.offer(t, "job-1", time.Minute), agentsdk.JobOptions{OnCancel: func(l *tetherv1.Lease) { cancelled <- l }})
	accepted(t, "accept", d, err)
	s.clock.Advance(10 * time.Second)
	d, err = job.Renew(ctx)
	accepted(t, "renew", d, err)
	d, err = job.Progress(ctx, "half")
	accepted(t, "progress", d, err)
	if l := job.Lease(); l.RenewSequence != 1 || l.ProgressSequence != 1 || !l.ExpiresAt.AsTime().Equal(leaseEpoch.Add(70*time.Second)) {
		t.Fatalf("after renew and progress: %v", l)
	}
	h := http.Header{}
	job.Header(h)
	if h.Get(agentsdk.HeaderJobID) != "job-1" || h.Get(agentsdk.HeaderLeaseGeneration) != "1" {
		t.Fatalf("fencing headers %v", h)
	}

	if _, err := s.planner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-1", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	d, err = job.Renew(ctx) // the worker learns of the cancel from the coordinator's answer
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED {
		t.Fatalf("renew after the cancel request: %v %v", d, err)
	}
	select {
	case <-cancelled:
	default:
		t.Fatal("OnCancel did not run")
	}
	if !errors.Is(context.Cause(job.Context()), agentsdk.ErrLeaseCancelled) {
		t.Fatalf("job context cause: %v", context.Cause(job.Context()))
	}
	if l := s.get(t, "job-1"); !l.CancelAck {
		t.Fatal("the worker did not acknowledge the cancel request")
	}
	d, err = job.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, "stopped")
	accepted(t, "complete", d, err)
	if l := s.get(t, "job-1"); l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED {
		t.Fatalf("after complete: %v", l)
	}
}

func TestLeaseWorkerRenewLoopStopsWhenTheCoordinatorSaysExpired(t *testing.T) {
	s := newLeaseSetup(t)
	// The worker's clock never moves: it never reaches the bound of its
	// last accepted renewal (ErrLeaseUnconfirmed), so only the
	// coordinator's answer can end the job.
	// The loop's tick is also each renewal's deadline (loopRenewEvery):
	// a busy machine's slower answers (a commit's fsync on a shared disk)
	// must not fail every renewal and leave the job running.
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: s.worker, SpoolDir: t.TempDir(), Clock: clock.NewManual(leaseEpoch), RenewEvery: loopRenewEvery})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	job, _, err := w.Accept(context.Background(), s.offer(t, "job-1", 30*time.Second), agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The worker's loop renews on its own schedule; the lease only ends
	// when the coordinator's clock passes the expiry with no renewal — cut
	// the network so none gets through, then move the coordinator's clock.
	s.net.disconnect()
	s.clock.Advance(31 * time.Second)
	select {
	case <-job.Done():
		t.Fatal("the loop stopped while the coordinator could not be asked")
	default:
	}
	s.net.cut.Store(false)
	select {
	case <-job.Done():
	case <-time.After(2 * time.Minute): // a guard against a hang, not a timing
		t.Fatal("the renew loop did not stop after the coordinator answered EXPIRED")
	}
	if !errors.Is(context.Cause(job.Context()), agentsdk.ErrLeaseLost) || errors.Is(context.Cause(job.Context()), agentsdk.ErrLeaseUnconfirmed) ||
		job.Lease().State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
		t.Fatalf("cause %v, lease %v", context.Cause(job.Context()), job.Lease())
	}
}

func TestLeaseWorkerSpoolsWhileDisconnectedAndReplaysInOrder(t *testing.T) {
	s := newLeaseSetup(t)
	dir := t.TempDir()
	w := s.newWorker(t, dir, time.Hour)
	ctx := context.Background()
	job, _, err := w.Accept(ctx, s.offer(t, "job-1", time.Minute), agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spooledAt := s.clock.Now()
	s.net.disconnect()
	for _, v := range []string{"10%", "20%"} {
		if _, err := job.Progress(ctx, v); !errors.Is(err, agentsdk.ErrSpooled) {
			t.Fatalf("progress while disconnected: %v", err)
		}
	}
	if _, err := job.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "done"); !errors.Is(err, agentsdk.ErrSpooled) {
		t.Fatalf("complete while disconnected: %v", err)
	}
	w.Close()

	// The agent restarts: a new worker on the same spool directory.
	s.clock.Advance(30 * time.Second)
	s.net.cut.Store(false)
	w2 := s.newWorker(t, dir, time.Hour)
	if w2.Pending() != 3 {
		t.Fatalf("%d messages in the spool after a restart, want 3", w2.Pending())
	}
	n, err := w2.Replay(ctx)
	if err != nil || n != 3 || w2.Pending() != 0 {
		t.Fatalf("replay: %d, %v, %d pending", n, err, w2.Pending())
	}
	l := s.get(t, "job-1")
	if l.ProgressSequence != 2 || l.ProgressValue != "20%" || l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS {
		t.Fatalf("after replay: %v", l)
	}
	// The replayed messages kept their original sent_at: the coordinator
	// notes the worker's timestamp, 30s older than its receipt.
	rows, err := s.planner.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job-1"}))
	if err != nil {
		t.Fatal(err)
	}
	last := rows.Msg.Rows[len(rows.Msg.Rows)-1]
	if last.Message != "complete" || !strings.Contains(last.Reason, spooledAt.Format(time.RFC3339Nano)) {
		t.Fatalf("last row: %s %q", last.Message, last.Reason)
	}
}

func TestLeaseWorkerReplayedResultFromAnExpiredGenerationIsRecordedNotAccepted(t *testing.T) {
	s := newLeaseSetup(t)
	dir := t.TempDir()
	w := s.newWorker(t, dir, time.Hour)
	ctx := context.Background()
	job, _, err := w.Accept(ctx, s.offer(t, "job-1", 30*time.Second), agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.net.disconnect()
	if _, err := job.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "done"); !errors.Is(err, agentsdk.ErrSpooled) {
		t.Fatalf("complete while disconnected: %v", err)
	}
	s.clock.Advance(time.Minute) // the lease expired while the worker was away
	s.net.cut.Store(false)
	if n, err := w.Replay(ctx); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	l := s.get(t, "job-1")
	if l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || l.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
		t.Fatalf("a result from an expired generation was accepted: %v", l)
	}
	rows, err := s.planner.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job-1"}))
	if err != nil {
		t.Fatal(err)
	}
	last := rows.Msg.Rows[len(rows.Msg.Rows)-1]
	if last.Message != "complete" || last.Decision.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || last.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED {
		t.Fatalf("the replayed result's row: %s %s %s", last.Message, last.Decision.Outcome, last.Decision.AuditEvent)
	}
}

// A recorded ownership conflict halts the job: the coordinator's planner
// (the lineage that coordinates the job) claims the active generation, the
// worker's next renewal is refused without extending authority, and the
// job's context ends with an error naming the lease and generation. Only
// the coordinator's Resolve settles it.
func TestLeaseWorkerCancelsTheJobOnAnOwnershipConflict(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour) // renewals driven by the test
	ctx := context.Background()
	offered := s.offer(t, "job-c", time.Minute)
	job, d, err := w.Accept(ctx, offered, agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	l := job.Lease()
	claim, err := s.planner.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1}))
	if err != nil || claim.Msg.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT {
		t.Fatalf("the planner's claim: %v %v", claim, err)
	}
	s.clock.Advance(10 * time.Second)
	d, err = job.Renew(ctx)
	if err != nil || d.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT {
		t.Fatalf("renew under the conflict: %v %v", d, err)
	}
	<-job.Done()
	cause := context.Cause(job.Context())
	var conflict *agentsdk.OwnershipConflictError
	if !errors.Is(cause, agentsdk.ErrOwnershipConflict) || !errors.As(cause, &conflict) ||
		conflict.JobID != "job-c" || conflict.LeaseID != l.LeaseId || conflict.Generation != 1 ||
		!strings.Contains(cause.Error(), l.LeaseId) || !strings.Contains(cause.Error(), "generation 1") {
		t.Fatalf("job context cause: %v", cause)
	}
	if got := s.get(t, "job-c"); !got.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) || got.RenewSequence != 0 {
		t.Fatalf("a renew under the conflict extended authority: %v", got)
	}
	if _, err := s.planner.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "job-c", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "two claimants"})); err != nil {
		t.Fatal(err)
	}
	if got := s.get(t, "job-c"); got.OwnershipConflict || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
		t.Fatalf("after Resolve: %v", got)
	}
}

// A Job speaks for its own generation only. The coordinator reassigns the
// job to the same worker (generation 2), which accepts it as a new Job;
// the old Job learns from a stale answer that it lost the lease. A zombie
// that keeps working with the old Job must not pass for generation 2: its
// fencing header still says generation 1 (a Fence refuses it once it saw
// generation 2), and its late success is judged as generation 1's and
// refused. The old Job used to adopt the answered lease — generation 2's
// id and number — so its header passed the fence and its success completed
// the new generation.
func TestLeaseWorkerAStaleJobNeverSpeaksForTheNextGeneration(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour) // renewals driven by the test
	ctx := context.Background()
	old, d, err := w.Accept(ctx, s.offer(t, "job-1", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept generation 1", d, err)
	r, err := s.planner.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-1", HolderIdentity: s.node, LeaseDuration: durationpb.New(time.Minute), Reason: "restart the job"}))
	if err != nil {
		t.Fatal(err)
	}
	d, err = old.Renew(ctx)
	if err != nil || d.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION {
		t.Fatalf("the old job's renew after the reassignment: %v %v", d, err)
	}
	if !errors.Is(context.Cause(old.Context()), agentsdk.ErrLeaseLost) {
		t.Fatalf("the old job's context cause: %v", context.Cause(old.Context()))
	}
	current, d, err := w.Accept(ctx, r.Msg.Lease, agentsdk.JobOptions{})
	accepted(t, "accept generation 2", d, err)

	h := http.Header{}
	old.Header(h)
	if got := h.Get(agentsdk.HeaderLeaseGeneration); got != "1" {
		t.Fatalf("the old job's fencing header says generation %s, want 1", got)
	}
	var fence agentsdk.Fence
	fence.Observe("job-1", 2) // the tool server saw generation 2's side effects
	gen, _ := strconv.ParseUint(h.Get(agentsdk.HeaderLeaseGeneration), 10, 64)
	if err := fence.Admit("job-1", gen); !errors.Is(err, agentsdk.ErrFenced) {
		t.Fatalf("the fence admitted the old job's side effect: %v", err)
	}
	d, err = old.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "zombie")
	if err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || d.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION {
		t.Fatalf("the old job's success: %v %v, want REJECTED STALE_GENERATION", d, err)
	}
	if l := s.get(t, "job-1"); l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || l.LeaseGeneration != 2 {
		t.Fatalf("after the old job's success: %v", l)
	}
	d, err = current.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "done")
	accepted(t, "generation 2's success", d, err)
}

// A rogue that can reach a fenced tool server sends a generation nobody
// holds (the header is its word): a fence that raised to it would refuse
// the real holder's every side effect until the tool server restarts,
// freezing a job the rogue has no part in. With IssuedGenerations the
// fence raises only to a generation the coordinator issued, asking it on
// the tool server's own credential; the real holder's calls pass, and a
// reassignment's next generation is admitted once the coordinator has it.
func TestAFenceRaisesOnlyToAGenerationTheCoordinatorIssued(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour)
	ctx := context.Background()
	job, d, err := w.Accept(ctx, s.offer(t, "job-1", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept generation 1", d, err)
	tool := agentsdk.Dial(s.srv.URL, s.srv.ToolServerToken(t, "fenced-tool"), agentsdk.WithHTTPClient(s.srv.HTTP))
	fence := agentsdk.Fence{Check: agentsdk.IssuedGenerations(tool)}
	effects := 0
	handler := fence.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { effects++ }))
	send := func(header http.Header) int {
		r := httptest.NewRequest(http.MethodPost, "/write", nil)
		for k, v := range header {
			r.Header[k] = v
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, r)
		return rec.Code
	}
	holder := http.Header{}
	job.Header(holder)
	if code := send(holder); code != http.StatusOK || effects != 1 {
		t.Fatalf("the holder's side effect: %d (effects %d)", code, effects)
	}
	rogue := http.Header{}
	rogue.Set(agentsdk.HeaderJobID, "job-1")
	rogue.Set(agentsdk.HeaderLeaseGeneration, "18446744073709551615")
	if code := send(rogue); code != http.StatusForbidden {
		t.Fatalf("a generation nobody was issued: %d, want 403", code)
	}
	if err := fence.AdmitContext(ctx, "job-1", 2); !errors.Is(err, agentsdk.ErrUnissuedGeneration) {
		t.Fatalf("generation 2 before the reassignment: %v, want ErrUnissuedGeneration", err)
	}
	if err := fence.AdmitContext(ctx, "no-such-job", 1); !errors.Is(err, agentsdk.ErrUnissuedGeneration) {
		t.Fatalf("a job the coordinator does not know: %v, want ErrUnissuedGeneration", err)
	}
	if fence.Highest("job-1") != 1 || effects != 1 {
		t.Fatalf("after the rogue: highest %d, effects %d; want 1 and 1", fence.Highest("job-1"), effects)
	}
	if code := send(holder); code != http.StatusOK || effects != 2 {
		t.Fatalf("the holder's next side effect after the rogue's: %d (effects %d)", code, effects)
	}
	r, err := s.planner.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-1", HolderIdentity: s.node, LeaseDuration: durationpb.New(time.Minute), Reason: "restart the job"}))
	if err != nil {
		t.Fatal(err)
	}
	next := http.Header{}
	next.Set(agentsdk.HeaderJobID, "job-1")
	next.Set(agentsdk.HeaderLeaseGeneration, strconv.FormatUint(r.Msg.Lease.LeaseGeneration, 10))
	if code := send(next); code != http.StatusForbidden || fence.Highest("job-1") != 2 {
		t.Fatalf("the reassigned generation before it was accepted (an offer carries no authority): %d, highest %d", code, fence.Highest("job-1"))
	}
	if code := send(holder); code != http.StatusConflict {
		t.Fatalf("generation 1 once the fence learnt of generation 2: %d, want 409", code)
	}
	second, d, err := w.Accept(ctx, r.Msg.Lease, agentsdk.JobOptions{})
	accepted(t, "accept generation 2", d, err)
	next = http.Header{}
	second.Header(next)
	if code := send(next); code != http.StatusOK || fence.Highest("job-1") != 2 {
		t.Fatalf("the reassigned generation: %d, highest %d", code, fence.Highest("job-1"))
	}
	if code := send(holder); code != http.StatusConflict {
		t.Fatalf("generation 1 after generation 2: %d, want 409", code)
	}
}
