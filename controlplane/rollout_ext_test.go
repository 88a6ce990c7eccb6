package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// swarm is a set of in-process agents, each with a stand-in launcher: on
// drain it starts the agent's replacement at v2 (which reports ready),
// lets the old agent finish its in-flight tool call, and confirms the old
// process's exit with the operator token.
type swarm struct {
	t     *testing.T
	srv   *testserver.Server
	clk   *clock.Manual
	op    *agentsdk.Conn
	admin *testserver.Clients
	gate  *agentsdk.ToolGate
	ctx   context.Context

	mu       sync.Mutex
	workers  map[string]*agentsdk.LeaseWorker // v2 node id → its lease worker
	stale    map[string]*tetherv1.Decision    // job → the old generation's late renew
	failures []error
	done     sync.WaitGroup
}

func (s *swarm) fail(err error) {
	s.mu.Lock()
	s.failures = append(s.failures, err)
	s.mu.Unlock()
}

// poll is WaitFor for goroutines other than the test's: it reports
// instead of failing the test.
func poll(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startV1 registers a v1 agent holding job's lease and running one tool
// call that finishes only once the agent drains and its lease has been
// handed over.
func (s *swarm) startV1(i int) {
	t, ctx := s.t, s.ctx
	name := fmt.Sprintf("worker-%02d", i)
	a, err := agentsdk.RegisterRoot(ctx, s.op, name, map[string]string{"app": "swarm", "version": "v1"})
	if err != nil {
		t.Fatal(err)
	}
	// The agent's "process": its session runs until it exits, before its
	// launcher confirms the exit (a launcher confirms a process it saw end;
	// a session still open would contradict it).
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = a.Run(runCtx) }()
	exitProcess := func() { stopRun(); <-ran }
	t.Cleanup(stopRun)
	<-a.Opened()
	issued, err := s.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: a.NodeID(), Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	jobID := fmt.Sprintf("job-%02d", i)
	offered, err := s.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: jobID, HolderIdentity: a.NodeID(), LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: a.Conn(), SpoolDir: t.TempDir(), RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	job, _, err := w.Accept(ctx, offered.Msg.Lease, agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	callStarted := make(chan struct{})
	callDone := make(chan error, 1)
	go func() {
		callDone <- s.gate.Call(ctx, issued.Msg.Token, "shell", func(context.Context) error {
			close(callStarted)
			<-a.Draining()
			<-release // in flight until the launcher lets it finish
			return nil
		})
	}()
	<-callStarted
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		if err := s.launch(a, job, jobID, name, release, callDone, exitProcess); err != nil {
			s.fail(fmt.Errorf("%s: %w", name, err))
		}
	}()
}

func (s *swarm) launch(old *agentsdk.Agent, job *agentsdk.Job, jobID, name string, release chan struct{}, callDone chan error, exitProcess func()) error {
	ctx := s.ctx
	select {
	case <-old.Draining():
	case <-ctx.Done():
		return ctx.Err()
	}
	node, err := s.admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: old.NodeID()}))
	if err != nil {
		return err
	}
	term := node.Msg.Node.TerminationId
	batch, err := s.batchOf(term)
	if err != nil {
		return err
	}
	if batch%2 == 1 {
		// Odd batches restart the classic way: the old process finishes and
		// exits first, and the new one starts only after the whole batch is
		// terminated. Nothing but the rollout's own rule then keeps the
		// next batch from starting before these replacements are ready.
		close(release)
		if err := <-callDone; err != nil {
			return fmt.Errorf("tool call: %w", err)
		}
		exitProcess()
		if err := s.confirmExit(old.NodeID()); err != nil {
			return err
		}
		if err := poll(ctx, "batch termination "+term, func() (bool, error) {
			resp, err := s.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term}))
			return err == nil && resp.Msg.Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED, err
		}); err != nil {
			return err
		}
		_, err := s.startV2(name)
		return err
	}
	// Even batches start the new version on drain (a surge): the
	// replacements are ready while the old agents still drain, so their
	// leases move while the old generation is alive to send late messages.
	if _, err := s.startV2(name); err != nil {
		return err
	}
	if err := poll(ctx, "the lease of "+jobID+" to move", func() (bool, error) {
		resp, err := s.admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: jobID}))
		return err == nil && resp.Msg.Lease.LeaseGeneration > 1, err
	}); err != nil {
		return err
	}
	// The old generation's renew arrives late: judged stale, recorded.
	d, err := job.Renew(ctx)
	if err != nil {
		return fmt.Errorf("late renew: %w", err)
	}
	s.mu.Lock()
	s.stale[jobID] = d
	s.mu.Unlock()
	close(release)
	if err := <-callDone; err != nil {
		return fmt.Errorf("tool call: %w", err)
	}
	exitProcess()
	return s.confirmExit(old.NodeID())
}

// confirmExit: the process exited; its launcher confirms it with the
// operator token.
func (s *swarm) confirmExit(node string) error {
	_, err := s.admin.Agent.ConfirmExit(s.ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: node, Reason: "drained"}))
	return err
}

func (s *swarm) batchOf(termination string) (int, error) {
	list, err := s.admin.Supervisor.ListRollouts(s.ctx, connect.NewRequest(&tetherv1.ListRolloutsRequest{}))
	if err != nil {
		return 0, err
	}
	for _, r := range list.Msg.Rollouts {
		for _, b := range r.Batches {
			if b.TerminationId == termination {
				return int(b.Index), nil
			}
		}
	}
	return 0, fmt.Errorf("termination %s is no rollout's batch", termination)
}

// startV2 registers the replacement, opens its session and reports it
// ready; each report moves the clock, so readiness and batch starts are
// ordered in the store's timestamps too.
func (s *swarm) startV2(name string) (*agentsdk.Agent, error) {
	ctx := s.ctx
	repl, err := agentsdk.RegisterRoot(ctx, s.op, name+"-v2", map[string]string{"app": "swarm", "version": "v2"})
	if err != nil {
		return nil, err
	}
	go repl.Run(ctx)
	<-repl.Opened()
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: repl.Conn(), SpoolDir: s.t.TempDir(), RenewEvery: time.Hour})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.workers[repl.NodeID()] = w
	s.mu.Unlock()
	s.clk.Advance(100 * time.Millisecond)
	return repl, repl.ReportReady(ctx)
}

// TestRollout30AgentsFromV1ToV2InBatchesOf5 is the rollout's done-when:
// 30 v1 agents, each holding a job lease and a tool call in flight, are
// replaced by v2 agents in batches of 5 through the real server.
func TestRollout30AgentsFromV1ToV2InBatchesOf5(t *testing.T) {
	const agents, batch = 30, 5
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := srv.AdminClients()
	op := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	gate := agentsdk.NewToolGate(agentsdk.Dial(srv.URL, srv.ToolServerToken(t, "gate-1"), agentsdk.WithHTTPClient(srv.HTTP)), "gate-1")
	defer gate.Close()
	<-gate.Ready()
	s := &swarm{t: t, srv: srv, clk: clk, op: op, admin: admin, gate: gate, ctx: ctx,
		workers: map[string]*agentsdk.LeaseWorker{}, stale: map[string]*tetherv1.Decision{}}
	for i := range agents {
		s.startV1(i)
	}
	t.Cleanup(func() {
		for _, w := range s.workers {
			w.Close()
		}
	})

	started, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{
		Selector: "app=swarm,version=v1", TargetSelector: "app=swarm,version=v2", Batch: batch,
		DrainWindow: durationpb.New(5 * time.Minute), ConfirmTimeout: durationpb.New(5 * time.Minute),
		BatchDeadline: durationpb.New(30 * time.Minute), Description: "model v2",
	}))
	if err != nil {
		t.Fatal(err)
	}
	rolloutID := started.Msg.Rollout.RolloutId
	stream, err := admin.Supervisor.WatchRollout(ctx, connect.NewRequest(&tetherv1.WatchRolloutRequest{RolloutId: rolloutID}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	// Every batch, seen at the moment it first appears: the facts the
	// reconciler decided on say its predecessors' replacements were ready.
	var final *tetherv1.Rollout
	seen := 0
	for stream.Receive() {
		r := stream.Msg().Rollout
		for ; seen < len(r.Batches); seen++ {
			b := r.Batches[seen]
			if got, want := r.Counts.ReplacementsReady, uint32(batch*seen); got < want {
				t.Errorf("batch %d started with %d replacements ready, want at least %d", seen, got, want)
			}
			if seen > 0 && r.Batches[seen-1].ReplacedAt == nil {
				t.Errorf("batch %d started before batch %d was replaced", seen, seen-1)
			}
			if len(b.NodeIds) != batch {
				t.Errorf("batch %d drains %d agents, want %d", seen, len(b.NodeIds), batch)
			}
		}
		if r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_ABORTED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
			final = r
			break
		}
	}
	if final == nil {
		t.Fatalf("watch ended without the rollout finishing: %v", stream.Err())
	}
	s.done.Wait()
	for _, err := range s.failures {
		t.Error(err)
	}
	if final.State != tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED {
		t.Fatalf("rollout %s: %s", final.State, final.Reason)
	}
	if len(final.Batches) != agents/batch || final.Counts.Drained != agents || final.Counts.LeasesHandedOver != agents {
		t.Fatalf("rollout counts %+v over %d batches, want %d agents in %d batches with %d leases handed over", final.Counts, len(final.Batches), agents, agents/batch, agents)
	}

	// No batch starts before its replacements are ready, on the clock too:
	// at each batch's start, at least batch × index v2 agents had reported
	// ready.
	v2, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: "app=swarm,version=v2"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(v2.Msg.Nodes) != agents {
		t.Fatalf("%d v2 agents, want %d", len(v2.Msg.Nodes), agents)
	}
	for i, b := range final.Batches {
		ready := 0
		for _, n := range v2.Msg.Nodes {
			if n.ReadyAt != nil && !n.ReadyAt.AsTime().After(b.StartedAt.AsTime()) {
				ready++
			}
		}
		if ready < batch*i {
			t.Errorf("batch %d started at %s with %d v2 agents ready, want at least %d", i, b.StartedAt.AsTime(), ready, batch*i)
		}
	}

	// One record per batch, each accounting for its five agents, all
	// confirmed by their launcher; no tool call unresolved.
	drained := map[string]int{}
	for i, b := range final.Batches {
		if b.RecordId == "" || b.State != tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE {
			t.Fatalf("batch %d: state %s record %q", i, b.State, b.RecordId)
		}
		rec := record(t, admin, b.TerminationId)
		if rec.RecordId != b.RecordId || rec.RolloutId != rolloutID || len(rec.RootNodeIds) != batch {
			t.Fatalf("batch %d record %s: rollout %q roots %v", i, rec.RecordId, rec.RolloutId, rec.RootNodeIds)
		}
		for _, n := range rec.Nodes {
			drained[n.NodeId]++
			if n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || n.ConfirmedBy != "operator:admin (launcher)" {
				t.Errorf("batch %d: node %s %s confirmed by %q", i, n.NodeId, n.Outcome, n.ConfirmedBy)
			}
		}
		if len(rec.ToolCalls) != batch {
			t.Errorf("batch %d record lists %d tool calls, want %d", i, len(rec.ToolCalls), batch)
		}
		for _, c := range rec.ToolCalls {
			if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
				t.Errorf("batch %d: call %s resolved %s, want completed", i, c.CallId, c.Resolution)
			}
		}
		for _, l := range rec.Leases {
			if l.Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER && l.HolderIdentity != "" {
				t.Errorf("batch %d: lease %s %s in the record, want handed over (or already moved)", i, l.JobId, l.Outcome)
			}
		}
	}
	recs, err := admin.Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{PageSize: 100}))
	if err != nil {
		t.Fatal(err)
	}
	perRollout := 0
	for _, r := range recs.Msg.Records {
		if r.RolloutId == rolloutID {
			perRollout++
		}
	}
	if perRollout != agents/batch || len(drained) != agents {
		t.Fatalf("%d records for the rollout covering %d agents, want %d records covering %d", perRollout, len(drained), agents/batch, agents)
	}
	for n, times := range drained {
		if times != 1 {
			t.Errorf("agent %s is in %d records", n, times)
		}
	}

	// Every lease ends on a v2 holder with a higher generation; the v2
	// holder ACKs it. The old generation's late renew was judged stale and
	// is in the evidence.
	lateRenews := 0
	for i := range agents {
		jobID := fmt.Sprintf("job-%02d", i)
		resp, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: jobID}))
		if err != nil {
			t.Fatal(err)
		}
		l := resp.Msg.Lease
		s.mu.Lock()
		w, onV2 := s.workers[l.HolderIdentity]
		late := s.stale[jobID]
		s.mu.Unlock()
		if !onV2 || l.LeaseGeneration != 2 || l.State != tetherv1.LeaseState_LEASE_STATE_OFFERED {
			t.Fatalf("%s: generation %d %s held by %s (v2: %v), want generation 2 offered to a v2 agent", jobID, l.LeaseGeneration, l.State, l.HolderIdentity, onV2)
		}
		if _, d, err := w.Accept(ctx, l, agentsdk.JobOptions{}); err != nil || d.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("%s: the v2 holder's ack: %v %v", jobID, d, err)
		}
		if late == nil {
			continue // an odd batch's job: its old holder was gone before the handover
		}
		lateRenews++
		if late.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || late.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION {
			t.Errorf("%s: the old generation's late renew was answered %v, want REJECTED STALE_GENERATION", jobID, late)
		}
		ev, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: jobID}))
		if err != nil {
			t.Fatal(err)
		}
		stale := false
		for _, row := range ev.Msg.Rows {
			stale = stale || (row.StaleGeneration && row.Decision.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		}
		if !stale {
			t.Errorf("%s: no STALE_GENERATION row in the evidence", jobID)
		}
	}
	if lateRenews != agents/2 {
		t.Errorf("%d late renews from old generations, want one per agent of the even batches (%d)", lateRenews, agents/2)
	}
	// Every drained agent is terminated.
	for id := range drained {
		n, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if n.Msg.Node.State != tetherv1.NodeState_NODE_STATE_TERMINATED {
			t.Errorf("drained agent %s is %s", id, n.Msg.Node.State)
		}
	}
}

// startRollout starts a rollout with the admin token.
func startRollout(t *testing.T, c *testserver.Clients, req *tetherv1.RolloutRequest) *tetherv1.Rollout {
	t.Helper()
	resp, err := c.Supervisor.Rollout(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("rollout: %v", err)
	}
	return resp.Msg.Rollout
}

// rolloutFirstBatchDrained starts a rollout from version=v1 to version=v2
// one node a batch (second-long drain and confirm windows, an hour's batch
// deadline) and advances clk until its first batch's termination finishes.
func rolloutFirstBatchDrained(t *testing.T, srv *testserver.Server, clk *clock.Manual) *tetherv1.Rollout {
	t.Helper()
	admin := srv.AdminClients()
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Hour)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	return r
}

// handoverFixture is a rollout's handover scene: a server on a manual
// clock with the rollout's reassignment hook, a planner (role=planner)
// and its v1 worker holding, acknowledged, each of the jobs it was made
// with (leases of ten minutes the planner offered).
type handoverFixture struct {
	srv     *testserver.Server
	clk     *clock.Manual
	hook    *reassignHook
	admin   *testserver.Clients
	planner *tetherv1.RegisterRootResponse
	pc      *testserver.Clients
	worker  *tetherv1.SpawnResponse
}

func newHandoverFixture(t *testing.T, jobs ...string) *handoverFixture {
	t.Helper()
	f := &handoverFixture{clk: clock.NewManual(epoch), hook: &reassignHook{}}
	f.srv = testserver.Start(t, testserver.WithClock(f.clk), f.hook.option())
	f.admin = f.srv.AdminClients()
	f.planner = registerLabelled(t, f.admin, "planner", map[string]string{"role": "planner"})
	f.pc = f.srv.Clients(f.planner.Credential)
	f.worker = spawnLabelled(t, f.pc, f.planner.Node.NodeId, "worker", map[string]string{"version": "v1"})
	wc := f.srv.Clients(f.worker.Credential)
	for _, job := range jobs {
		resp, err := f.pc.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: f.worker.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		unary{wc}.send(t, ack(resp.Msg.Lease))
	}
	return f
}

// finished waits, advancing the clock (the reconciler's retries are on
// it), until rollout r is no longer running, and returns it.
func (f *handoverFixture) finished(t *testing.T, r *tetherv1.Rollout) *tetherv1.Rollout {
	t.Helper()
	testserver.WaitFor(t, 20*time.Second, "the rollout to finish", func() bool {
		f.clk.Advance(2 * time.Second)
		r = getRollout(t, f.admin, r.RolloutId)
		return r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING
	})
	return r
}

// reassignHook hooks the rollout's "before-reassign" fault point (install
// it with option): it counts the points reached and runs a step armed for
// one of them.
type reassignHook struct {
	mu    sync.Mutex
	calls int
	at    int // the point the step runs at, counted from the first; 0 for the next one
	step  func()
	// passed: the points passed, each counted once the step armed for it
	// returned (what the step wrote is the test's to read then).
	passed int
}

func (h *reassignHook) option() testserver.Option {
	return func(cfg *controlplane.Config) {
		cfg.RolloutFault = func(point string) {
			if point != "before-reassign" {
				return
			}
			h.mu.Lock()
			h.calls++
			s := h.step
			if h.at == 0 || h.calls == h.at {
				h.step = nil
			} else {
				s = nil
			}
			h.mu.Unlock()
			if s != nil {
				s()
			}
			h.mu.Lock()
			h.passed++
			h.mu.Unlock()
		}
	}
}

// arm has step run once, at the at-th point reached (0: the next one).
func (h *reassignHook) arm(at int, step func()) {
	h.mu.Lock()
	h.at, h.step = at, step
	h.mu.Unlock()
}

// reached is how many points have been passed, the step armed for one
// having returned.
func (h *reassignHook) reached() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.passed
}

func getRollout(t *testing.T, c *testserver.Clients, id string) *tetherv1.Rollout {
	t.Helper()
	resp, err := c.Supervisor.GetRollout(context.Background(), connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Rollout
}

func waitRollout(t *testing.T, srv *testserver.Server, id, what string, cond func(*tetherv1.Rollout) bool) *tetherv1.Rollout {
	t.Helper()
	var last *tetherv1.Rollout
	testserver.WaitFor(t, 20*time.Second, "rollout "+id+" "+what, func() bool {
		last = getRollout(t, srv.AdminClients(), id)
		return cond(last)
	})
	return last
}

func registerLabelled(t *testing.T, c *testserver.Clients, name string, labels map[string]string) *tetherv1.RegisterRootResponse {
	t.Helper()
	resp, err := c.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name, Labels: labels}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

func launcherConfirmsExit(t *testing.T, c *testserver.Clients, node string) {
	t.Helper()
	if _, err := c.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: node})); err != nil {
		t.Fatal(err)
	}
}

// rolloutPausedAtItsFirstDeadline starts a rollout of the nodes labelled
// version=v1 to version=v2, a batch of one with a minute's deadline; the
// launcher confirms the exit of batch 0's node, and clk passes the batch's
// deadline with no replacement: it returns the rollout, paused.
func rolloutPausedAtItsFirstDeadline(t *testing.T, srv *testserver.Server, admin *testserver.Clients, clk *clock.Manual) *tetherv1.Rollout {
	t.Helper()
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	launcherConfirmsExit(t, admin, r.Batches[0].NodeIds[0])
	waitRollout(t, srv, r.RolloutId, "to terminate batch 0", func(r *tetherv1.Rollout) bool { return r.Batches[0].TerminatedAt != nil })
	clk.Advance(time.Minute) // past batch 0's deadline, no replacement: paused
	return waitRollout(t, srv, r.RolloutId, "to pause at batch 0's deadline", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED })
}

func reportReady(t *testing.T, c *testserver.Clients, node string) {
	t.Helper()
	if _, err := c.Agent.ReportReady(context.Background(), connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: node})); err != nil {
		t.Fatal(err)
	}
}

// TestRolloutBatchMissingItsDeadlinePausesAndResumes: with no replacement
// the batch's deadline passes on the manual clock, the rollout pauses with
// the reason and starts nothing more; a replacement and a resume finish it.
func TestRolloutBatchMissingItsDeadlinePausesAndResumes(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	var old []string
	for i := range 2 {
		old = append(old, registerLabelled(t, admin, fmt.Sprintf("a%d", i), map[string]string{"version": "v1"}).Node.NodeId)
	}
	r := rolloutPausedAtItsFirstDeadline(t, srv, admin, clk)
	if want := `0 of 1 replacements matching "version=v2" are ready`; !strings.Contains(r.Reason, want) {
		t.Fatalf("pause reason %q, want it to say %q", r.Reason, want)
	}
	// Paused: a replacement arriving finishes the batch, but the next one
	// does not start.
	v2 := registerLabelled(t, admin, "b0", map[string]string{"version": "v2"})
	reportReady(t, admin, v2.Node.NodeId)
	r = waitRollout(t, srv, r.RolloutId, "to finish batch 0", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE
	})
	if r = getRollout(t, admin, r.RolloutId); len(r.Batches) != 1 || r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
		t.Fatalf("paused rollout moved on: %d batches, %s", len(r.Batches), r.State)
	}
	if _, err := admin.Supervisor.ResumeRollout(context.Background(), connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	r = waitRollout(t, srv, r.RolloutId, "to start batch 1", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 2 })
	if r.Batches[1].NodeIds[0] == r.Batches[0].NodeIds[0] || !strings.Contains(old[0]+old[1], r.Batches[1].NodeIds[0]) {
		t.Fatalf("batch 1 drains %v", r.Batches[1].NodeIds)
	}
	launcherConfirmsExit(t, admin, r.Batches[1].NodeIds[0])
	v2b := registerLabelled(t, admin, "b1", map[string]string{"version": "v2"})
	reportReady(t, admin, v2b.Node.NodeId)
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if r.Counts.BatchesDone != 2 {
		t.Fatalf("counts %+v", r.Counts)
	}
	// A finished rollout cannot be resumed or aborted.
	_, err := admin.Supervisor.AbortRollout(context.Background(), connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: r.RolloutId}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("abort of a completed rollout: %v", err)
	}
}

// TestRolloutAbortReleasesTheDrainingBatchsLeases: aborting while a batch
// drains turns it into a plain termination: its lease is cancelled and
// reconciled in its record instead of handed over, and nothing else
// starts.
func TestRolloutAbortReleasesTheDrainingBatchsLeases(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	jobs := map[string]string{}
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	for _, name := range []string{"a", "b"} {
		n := registerLabelled(t, admin, name, map[string]string{"version": "v1"})
		jobs[n.Node.NodeId] = "job-" + name
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: n.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		// An in-flight call keeps the batch draining.
		if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"})); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-" + name, HolderIdentity: n.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)})); err != nil {
			t.Fatal(err)
		}
	}
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Second)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	job := jobs[r.Batches[0].NodeIds[0]]
	waitState(t, srv, r.Batches[0].TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	ab, err := admin.Supervisor.AbortRollout(ctx, connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: r.RolloutId, Reason: "v2 is worse"}))
	if err != nil {
		t.Fatal(err)
	}
	if ab.Msg.Rollout.State != tetherv1.RolloutState_ROLLOUT_STATE_ABORTED || !strings.Contains(ab.Msg.Rollout.Reason, "v2 is worse") {
		t.Fatalf("abort answered %s %q", ab.Msg.Rollout.State, ab.Msg.Rollout.Reason)
	}
	r = waitRollout(t, srv, r.RolloutId, "to release its batch", func(r *tetherv1.Rollout) bool {
		return r.Batches[0].State == tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_RELEASED
	})
	// The drain window, the cancel-ack and confirm timeouts pass; the
	// termination finishes as a plain one.
	testserver.WaitFor(t, 20*time.Second, "the released batch's termination to finish", func() bool {
		clk.Advance(10 * time.Second)
		return getTermination(t, admin, r.Batches[0].TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, r.Batches[0].TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != job || rec.Leases[0].Outcome == tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER {
		t.Fatalf("record leases %v, want %s reconciled, not handed over", rec.Leases, job)
	}
	l, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
	if err != nil {
		t.Fatal(err)
	}
	if l.Msg.Lease.LeaseGeneration != 1 || l.Msg.Lease.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL {
		t.Fatalf("%s after abort: generation %d %s, want generation 1 terminal", job, l.Msg.Lease.LeaseGeneration, l.Msg.Lease.State)
	}
	if r = getRollout(t, admin, r.RolloutId); len(r.Batches) != 1 {
		t.Fatalf("an aborted rollout started batch %d", len(r.Batches)-1)
	}
}

// TestRolloutRequestsAreValidatedAndOperatorOnly: bad requests change
// nothing; agents and viewers cannot start or steer rollouts.
func TestRolloutRequestsAreValidatedAndOperatorOnly(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	for _, req := range []*tetherv1.RolloutRequest{
		{TargetSelector: "version=v2"},
		{Selector: "version=v1"},
		{Selector: "version=v1", TargetSelector: "version=v1"},
		{Selector: "version=v1", TargetSelector: "version=v2", Batch: 5, MaxUnavailable: 2},
		{Selector: "version", TargetSelector: "version=v2"},
	} {
		if _, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(req)); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%v: %v, want invalid_argument", req, err)
		}
	}
	list, err := admin.Supervisor.ListRollouts(ctx, connect.NewRequest(&tetherv1.ListRolloutsRequest{}))
	if err != nil || len(list.Msg.Rollouts) != 0 {
		t.Fatalf("refused requests left rollouts: %v %v", list, err)
	}
	agent := registerLabelled(t, admin, "a", map[string]string{"version": "v1"})
	viewer, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_VIEWER}))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*testserver.Clients{"agent": srv.Clients(agent.Credential), "viewer": srv.Clients(viewer.Msg.Token)} {
		_, err := c.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2"}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s started a rollout: %v", name, err)
		}
	}
	for _, id := range []string{"", "o_nope", "t_00000000000000000000"} {
		if _, err := admin.Supervisor.GetRollout(ctx, connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: id})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("get rollout %q: %v", id, err)
		}
	}
	if _, err := admin.Supervisor.PauseRollout(ctx, connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: "o_00000000000000000000"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("pause of an unknown rollout: %v", err)
	}
	// An agent reports only its own readiness; an operator (a launcher) any.
	other := registerLabelled(t, admin, "b", nil)
	if _, err := srv.Clients(agent.Credential).Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: other.Node.NodeId})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("an agent reported another's readiness: %v", err)
	}
	resp, err := srv.Clients(agent.Credential).Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: agent.Node.NodeId}))
	if err != nil || resp.Msg.Node.ReadyAt == nil {
		t.Fatalf("own readiness: %v %v", resp, err)
	}
	first := resp.Msg.Node.ReadyAt.AsTime()
	again, err := admin.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: agent.Node.NodeId}))
	if err != nil || !again.Msg.Node.ReadyAt.AsTime().Equal(first) {
		t.Fatalf("a second report moved ready_at: %v %v", again, err)
	}
}

// TestRolloutResumesAfterARestart: the rollout is a persisted desired
// state; a server restarted mid-batch carries on from the store, with one
// termination (and one record) per batch.
func TestRolloutResumesAfterARestart(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	for i := range 4 {
		registerLabelled(t, admin, fmt.Sprintf("a%d", i), map[string]string{"version": "v1"})
	}
	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 2,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start batch 0", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	first := r.Batches[0]

	srv.Stop()
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin = srv.AdminClients()
	for b := range 2 {
		r = waitRollout(t, srv, r.RolloutId, fmt.Sprintf("to have batch %d", b), func(r *tetherv1.Rollout) bool { return len(r.Batches) > b })
		for _, n := range r.Batches[b].NodeIds {
			launcherConfirmsExit(t, admin, n)
			reportReady(t, admin, registerLabelled(t, admin, "v2", map[string]string{"version": "v2"}).Node.NodeId)
		}
	}
	r = waitRollout(t, srv, r.RolloutId, "to complete", func(r *tetherv1.Rollout) bool { return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED })
	if r.Batches[0].TerminationId != first.TerminationId || len(r.Batches) != 2 {
		t.Fatalf("after the restart batch 0 is %s (was %s), %d batches", r.Batches[0].TerminationId, first.TerminationId, len(r.Batches))
	}
	recs, err := admin.Supervisor.ListRecords(context.Background(), connect.NewRequest(&tetherv1.ListRecordsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	perTermination := map[string]int{}
	for _, rec := range recs.Msg.Records {
		perTermination[rec.TerminationId]++
	}
	if len(perTermination) != 2 || perTermination[r.Batches[0].TerminationId] != 1 || perTermination[r.Batches[1].TerminationId] != 1 {
		t.Fatalf("records per termination %v, want one for each of the two batches", perTermination)
	}
}
