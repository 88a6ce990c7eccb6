// Package demo plays a realistic swarm against an embedded control plane
// and terminates it, as `tether demo` shows a newcomer: a planner spawns
// workers, workers spawn retrieval and code-execution sub-agents, each with
// delegated, attenuated grants, calling tools through ToolGates, holding job
// leases and privileges — and one rogue grandchild that ignores the drain.
//
// The scenario is orchestrated, not timed: it waits for each fact it needs
// (a call in flight, a signal received) before the next step, so its
// outcome is the same on a slow machine; only times and ids differ.
package demo

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/embedded"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/sortedmap"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Options shape the swarm.
type Options struct {
	// Workers under the planner (each with two sub-agents); at least 1.
	Workers int
	// Mode is "drain" or "abort".
	Mode string
	// Seed makes tool latencies and the rogue's choice repeatable.
	Seed uint64
	// DrainWindow bounds the drain before escalation (drain mode).
	DrainWindow time.Duration
	// Dir holds the control plane's data and the record; empty: a temp dir.
	Dir string
}

// prepare fills in the drain window's default and returns the directory
// the run keeps its data in: Dir, or a new temporary one named tempPrefix*.
func (o *Options) prepare(tempPrefix string) (string, error) {
	if o.DrainWindow <= 0 {
		o.DrainWindow = 2 * time.Second
	}
	if o.Dir != "" {
		return o.Dir, nil
	}
	return os.MkdirTemp("", tempPrefix)
}

// Result is what the demo produced.
type Result struct {
	Record     *tetherv1.ReconciliationRecord
	RecordPath string
	RogueNode  string
	// RogueAfter is the code the rogue's call got after the termination.
	RogueAfter connect.Code
}

type swarmAgent struct {
	name   string
	role   string // planner, worker, retrieval, code-exec
	agent  *agentsdk.Agent
	grant  agentsdk.Grant
	tool   *toolServer
	rogue  bool
	parent *swarmAgent
}

// Run plays the demo, writing the story to out.
func Run(ctx context.Context, opts Options, out io.Writer) (*Result, error) {
	if opts.Workers < 1 {
		opts.Workers = 2
	}
	if opts.Mode == "" {
		opts.Mode = "drain"
	}
	if opts.Mode != "drain" && opts.Mode != "abort" {
		return nil, fmt.Errorf("mode %q: want drain or abort", opts.Mode)
	}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
	dir, err := opts.prepare("tether-demo-")
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	// 1. An embedded control plane on Badger, on loopback.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The demo's revoke webhooks live on loopback: the operator allows it.
	srv, err := embedded.Start(ctx, filepath.Join(dir, "data"), func(cfg *controlplane.Config) {
		cfg.PrivilegeHookAllow = []string{"127.0.0.1"}
	})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	url := srv.URL
	admin := agentsdk.Dial(url, srv.AdminToken)
	say("▶ control plane on %s (Badger in %s)", url, filepath.Join(dir, "data"))

	// 2. Tool servers behind ToolGates, each with its own tool-server token
	// (never an agent's credential: the record's tool-call evidence comes
	// from the tool layer).
	upstream, stopUpstream, err := startUpstream(30 * time.Millisecond)
	if err != nil {
		return nil, err
	}
	defer stopUpstream()
	gateConns := map[string]*agentsdk.Conn{}
	for _, name := range []string{"shell-gate", "http-gate"} {
		minted, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: name, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			return nil, err
		}
		gateConns[name] = agentsdk.Dial(url, minted.Msg.Token)
	}
	shellGate := agentsdk.NewToolGate(gateConns["shell-gate"], "shell-gate")
	httpGate := agentsdk.NewToolGate(gateConns["http-gate"], "http-gate")
	shell, err := startToolServer("shell", shellGate, shellHandler)
	if err != nil {
		return nil, err
	}
	defer shell.close()
	fetch, err := startToolServer("http", httpGate, fetchHandler(upstream))
	if err != nil {
		return nil, err
	}
	defer fetch.close()
	<-shellGate.Ready()
	<-httpGate.Ready()
	say("▶ tools: shell at %s, http at %s, each behind a ToolGate", shell.url, fetch.url)

	// 3. The swarm: planner → workers → retrieval + code-exec, with grants
	// attenuated at each step.
	planner, err := agentsdk.RegisterRoot(ctx, admin, "planner", map[string]string{"app": "research", "version": "v1"})
	if err != nil {
		return nil, err
	}
	root, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: planner.NodeID(), Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		return nil, err
	}
	swarm := []*swarmAgent{{name: "planner", role: "planner", agent: planner, grant: agentsdk.Grant{Grant: root.Msg.Grant, Token: root.Msg.Token}}}
	rogueWorker := int(rng.Uint64N(uint64(opts.Workers)))
	for w := 0; w < opts.Workers; w++ {
		worker, err := spawnAgent(ctx, url, swarm[0], fmt.Sprintf("worker-%d", w+1), "worker", []string{"tool:shell", "tool:http"})
		if err != nil {
			return nil, err
		}
		swarm = append(swarm, worker)
		retrieval, err := spawnAgent(ctx, url, worker, fmt.Sprintf("retrieval-%d", w+1), "retrieval", []string{"tool:http"})
		if err != nil {
			return nil, err
		}
		retrieval.tool = fetch
		codeExec, err := spawnAgent(ctx, url, worker, fmt.Sprintf("code-exec-%d", w+1), "code-exec", []string{"tool:shell"})
		if err != nil {
			return nil, err
		}
		codeExec.tool = shell
		if w == rogueWorker {
			retrieval.rogue = true
		}
		swarm = append(swarm, retrieval, codeExec)
	}
	// Attenuation is enforced: a retrieval agent cannot widen its grant.
	var rogue *swarmAgent
	for _, a := range swarm {
		if a.rogue {
			rogue = a
		}
	}
	_, err = rogue.agent.Delegate(ctx, rogue.grant.GrantId, rogue.agent.NodeID(), []string{"tool:shell"}, 0)
	say("▶ swarm: 1 planner, %d workers, %d sub-agents; every grant delegated and attenuated", opts.Workers, 2*opts.Workers)
	say("  (a sub-agent trying to widen its own grant is refused: %s)", connect.CodeOf(err))

	// 4. Sessions: every agent but the rogue honours drain and abort.
	runCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	var agentsWG sync.WaitGroup
	for _, a := range swarm {
		agentsWG.Add(1)
		go func() { defer agentsWG.Done(); _ = a.agent.Run(runCtx) }()
		<-a.agent.Opened()
	}

	// 5. Job leases for the workers, and privileges on the grants.
	leaseDone := make(chan struct{})
	var leaseWG sync.WaitGroup
	for i, a := range swarm {
		if a.role != "worker" {
			continue
		}
		job := fmt.Sprintf("job-%d", i)
		offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: a.agent.NodeID(), LeaseDuration: durationpb.New(5 * time.Second)}))
		if err != nil {
			return nil, fmt.Errorf("offer %s: %w", job, err)
		}
		leaseWG.Add(1)
		go func() { defer leaseWG.Done(); workLease(runCtx, a, offer.Msg.Lease, leaseDone) }()
		if _, err := admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
			NodeId: a.agent.NodeID(), Kind: "file_lock", ExternalId: "/data/" + job + ".lock",
			ExpiresAt: timestamppb.New(time.Now().Add(time.Hour)), RevokeUrl: upstream + "/revoke",
		})); err != nil {
			return nil, err
		}
		if _, err := admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
			NodeId: a.agent.NodeID(), Kind: "rate_limit_token", ExternalId: "openai:" + job,
			ExpiresAt: timestamppb.New(time.Now().Add(300 * time.Millisecond)), RevokeUrl: upstream + "/revoke",
		})); err != nil {
			return nil, err
		}
	}
	say("▶ %d job leases offered and acked; file locks and rate-limit tokens registered as privileges", opts.Workers)

	// The planner confirms its exit once told to drain (its children are
	// the supervisor's business, not its own).
	go func() {
		select {
		case <-planner.Draining():
			_ = planner.Exit(context.WithoutCancel(ctx), "drained")
		case <-runCtx.Done():
		}
	}()

	// 6. Work: each sub-agent makes a few tool calls, then waits for more
	// work or a signal. The rogue ignores signals and calls whenever it can.
	hc := &http.Client{Timeout: 30 * time.Second}
	var workWG sync.WaitGroup
	rogueCalls := make(chan chan int)
	var warm sync.WaitGroup
	for _, a := range swarm {
		if a.tool == nil {
			continue
		}
		latency := 20 + int(rng.Uint64N(60))
		workWG.Add(1)
		warm.Add(1)
		go func() { defer workWG.Done(); work(runCtx, hc, a, latency, 3, warm.Done, rogueCalls) }()
	}
	warm.Wait()
	rogueCall := func() int {
		reply := make(chan int)
		rogueCalls <- reply
		return <-reply
	}
	// Two calls that are in flight when the termination starts: one short
	// enough to finish in the drain window, one that will not.
	var codeExec *swarmAgent
	for _, a := range swarm {
		if a.role == "code-exec" {
			codeExec = a
			break
		}
	}
	finishing := fmt.Sprintf("%s?cmd=pytest&duration_ms=%d&tag=finishing", shell.url, opts.DrainWindow.Milliseconds()/3)
	stuck := fmt.Sprintf("%s?cmd=train-model&duration_ms=%d&tag=stuck", shell.url, (10 * time.Minute).Milliseconds())
	go func() { _, _ = callTool(context.WithoutCancel(ctx), hc, finishing, codeExec.grant.Token) }()
	go func() { _, _ = callTool(context.WithoutCancel(ctx), hc, stuck, codeExec.grant.Token) }()
	<-shell.startedChan("finishing")
	<-shell.startedChan("stuck")
	say("▶ the swarm is working: %d tool calls done, 2 in flight (a quick test run, a long training job), leases renewing", 3*2*opts.Workers)

	// 7. The operator terminates the planner's subtree.
	mode := tetherv1.TerminationMode_TERMINATION_MODE_DRAIN
	if opts.Mode == "abort" {
		mode = tetherv1.TerminationMode_TERMINATION_MODE_ABORT
	}
	say("\n$ tether terminate %s --mode %s --window %s --wait", planner.NodeID(), opts.Mode, opts.DrainWindow)
	term, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: planner.NodeID(), Mode: mode, Reason: "demo: operator stops the research swarm",
		DrainWindow: durationpb.New(opts.DrainWindow), CancelAckTimeout: durationpb.New(2 * time.Second), ConfirmTimeout: durationpb.New(3 * time.Second),
	}))
	if err != nil {
		return nil, err
	}
	termID := term.Msg.Termination.TerminationId
	stream, err := admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: termID}))
	if err != nil {
		return nil, err
	}
	lastState := tetherv1.TerminationState_TERMINATION_STATE_UNSPECIFIED
	var final *tetherv1.Termination
	// The first snapshot of a stopping state is published when the subtree
	// is marked, before the control plane has counted the calls the mark
	// caught in flight (it counts them on its next pass): a line printed
	// from it said "0 tool call(s) in flight" while two were. The line
	// waits for the count, or for the state to end.
	var stopping *tetherv1.Termination
	announce := func(t *tetherv1.Termination) {
		say("  %-12s %d nodes marked in one transaction, %d tool call(s) in flight; signals pushed to every session",
			strings.ToLower(strings.TrimPrefix(t.State.String(), "TERMINATION_STATE_")), t.Progress.GetNodesTotal(), t.Progress.GetCallsInFlight())
		say("               the rogue ignores the signal and calls again: HTTP %d (refused: the node is stopping)", rogueCall())
	}
	for stream.Receive() {
		t := stream.Msg().Termination
		if stopping != nil {
			if t.State == stopping.State && !t.Escalated {
				if t.Progress.GetCallsInFlight() == 0 {
					stopping = t
				} else {
					announce(t)
					stopping = nil
				}
				continue
			}
			announce(stopping)
			stopping = nil
		}
		if t.State == lastState {
			continue
		}
		lastState = t.State
		p := t.Progress
		switch t.State {
		case tetherv1.TerminationState_TERMINATION_STATE_DRAINING, tetherv1.TerminationState_TERMINATION_STATE_ABORTING:
			if t.Escalated {
				say("  aborting     the drain window is over: escalated to abort, cancelling %d call(s)", p.GetCallsInFlight())
				break
			}
			if p.GetCallsInFlight() == 0 {
				stopping = t
				break
			}
			announce(t)
		case tetherv1.TerminationState_TERMINATION_STATE_RECONCILING:
			say("  reconciling  revoking grants and privileges, cancelling job leases, collecting exit confirmations")
		case tetherv1.TerminationState_TERMINATION_STATE_TERMINATED:
			say("  terminated   %d/%d exits confirmed; record %s", p.GetConfirmations(), p.GetNodesTotal(), t.RecordId)
			final = t
		}
		if final != nil {
			break
		}
	}
	stream.Close()
	if final == nil {
		return nil, fmt.Errorf("watch ended early: %v", stream.Err())
	}
	close(leaseDone)

	// 8. The record.
	rec, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: termID}))
	if err != nil {
		return nil, err
	}
	say("")
	PrintRecord(out, rec.Msg.Record, names(swarm))

	// 9. The rogue tries again: its token died with the subtree.
	say("\n▶ the rogue (%s) calls again with its token: HTTP %d — its grant was revoked with the subtree", rogue.name, rogueCall())
	res := &Result{Record: rec.Msg.Record, RogueNode: rogue.agent.NodeID()}
	_, err = gateConns["http-gate"].Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: rogue.grant.Token, Tool: "http", GateId: "http-gate"}))
	res.RogueAfter = connect.CodeOf(err)

	b, err := wire.RecordJSON(rec.Msg.Record)
	if err != nil {
		return nil, err
	}
	res.RecordPath = filepath.Join(dir, "record-"+rec.Msg.Record.RecordId+".json")
	if err := os.WriteFile(res.RecordPath, b, 0o644); err != nil {
		return nil, err
	}
	say("▶ full record (JSON, schema docs/record.schema.json): %s", res.RecordPath)

	stopAgents()
	workWG.Wait()
	leaseWG.Wait()
	agentsWG.Wait()
	return res, nil
}

func names(swarm []*swarmAgent) map[string]string {
	out := map[string]string{}
	for _, a := range swarm {
		out[a.agent.NodeID()] = a.name
	}
	return out
}

// spawnAgent spawns a child under parent, joins it with its own credential
// (as the child's process would) and delegates it an attenuated grant.
func spawnAgent(ctx context.Context, url string, parent *swarmAgent, name, role string, scopes []string) (*swarmAgent, error) {
	// Each level's grant ends before its parent's: attenuation in time.
	ttl := map[string]time.Duration{"worker": 45 * time.Minute}[role]
	if ttl == 0 {
		ttl = 30 * time.Minute
	}
	child, err := parent.agent.Spawn(ctx, name, map[string]string{"role": role, "version": "v1"})
	if err != nil {
		return nil, fmt.Errorf("spawn %s: %w", name, err)
	}
	a, err := agentsdk.Join(ctx, url, child.Credential, nil)
	if err != nil {
		return nil, err
	}
	g, err := parent.agent.Delegate(ctx, parent.grant.GrantId, a.NodeID(), scopes, ttl)
	if err != nil {
		return nil, fmt.Errorf("delegate to %s: %w", name, err)
	}
	return &swarmAgent{name: name, role: role, agent: a, grant: g, parent: parent}, nil
}

// work makes `calls` tool calls, then waits. An honest agent, told to
// drain, finishes the call in hand and confirms its exit; the rogue ignores
// every signal and calls whenever the demo lets it (so the story is the
// same on every run).
func work(ctx context.Context, hc *http.Client, a *swarmAgent, latency, calls int, warmedUp func(), rogueCalls <-chan chan int) {
	url := a.tool.url
	if a.role == "code-exec" {
		url += fmt.Sprintf("?cmd=lint&duration_ms=%d", latency)
	} else {
		url += "?q=" + a.name
	}
	for i := 0; i < calls; i++ {
		callCtx := a.agent.Context()
		if a.rogue {
			callCtx = ctx
		}
		_, _ = callTool(callCtx, hc, url, a.grant.Token)
	}
	warmedUp()
	if a.rogue {
		for {
			select {
			case <-ctx.Done():
				return
			case reply := <-rogueCalls:
				code, _ := callTool(ctx, hc, url, a.grant.Token)
				reply <- code
			}
		}
	}
	select {
	case <-a.agent.Draining():
		_ = a.agent.Exit(context.WithoutCancel(ctx), "drained")
	case <-ctx.Done():
	}
}

// workLease acks the lease, renews it and reports progress, and
// acknowledges a cancellation; the worker confirms its exit only after
// its lease is settled.
func workLease(ctx context.Context, a *swarmAgent, l *tetherv1.Lease, done <-chan struct{}) {
	conn := a.agent.Conn()
	ack, err := conn.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, SentAt: timestamppb.Now()}))
	if err != nil {
		return
	}
	l = ack.Msg.Lease
	seq := uint64(0)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-ticker.C:
		}
		seq++
		renew, err := conn.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq, SentAt: timestamppb.Now()}))
		if err != nil {
			return
		}
		if renew.Msg.Lease.CancelRequested {
			_, _ = conn.Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, SentAt: timestamppb.Now()}))
			_ = a.agent.Exit(context.WithoutCancel(ctx), "lease cancelled and acknowledged")
			return
		}
		_, _ = conn.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: seq, ProgressValue: fmt.Sprintf("%d%%", min(99, seq)), SentAt: timestamppb.Now()}))
	}
}

// PrintRecord renders the record for people, with agents' names.
func PrintRecord(w io.Writer, r *tetherv1.ReconciliationRecord, names map[string]string) {
	name := func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return id
	}
	lower := func(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }
	fmt.Fprintf(w, "Reconciliation record %s — written by the control plane, not the agents\n", r.RecordId)
	fmt.Fprintf(w, "  mode %s%s; phases:", lower(r.Mode.String(), "TERMINATION_MODE_"), map[bool]string{true: ", escalated to abort", false: ""}[r.Escalated])
	for _, p := range r.Phases {
		fmt.Fprintf(w, " %s", p.Name)
	}
	fmt.Fprintln(w)

	calls := map[string]int{}
	for _, c := range r.ToolCalls {
		calls[lower(c.Resolution.String(), "CALL_RESOLUTION_")]++
	}
	fmt.Fprintf(w, "  tool calls in flight or refused: %s\n", counts(calls))
	privs := map[string]int{}
	for _, p := range r.Privileges {
		privs[lower(p.Outcome.String(), "PRIVILEGE_OUTCOME_")+" "+p.Kind]++
	}
	fmt.Fprintf(w, "  privileges: %s\n", counts(privs))
	leases := map[string]int{}
	for _, l := range r.Leases {
		leases[lower(l.Outcome.String(), "LEASE_OUTCOME_")]++
	}
	fmt.Fprintf(w, "  job leases: %s\n", counts(leases))
	var confirmed, unaccounted []string
	for _, n := range r.Nodes {
		if n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
			confirmed = append(confirmed, name(n.NodeId))
		} else {
			unaccounted = append(unaccounted, fmt.Sprintf("%s (still held %d grants, %d jobs)", name(n.NodeId), len(n.HeldGrantIds), len(n.HeldJobIds)))
		}
	}
	sort.Strings(confirmed)
	sort.Strings(unaccounted)
	fmt.Fprintf(w, "  confirmed terminated (%d): %s\n", len(confirmed), strings.Join(confirmed, ", "))
	fmt.Fprintf(w, "  UNACCOUNTED (%d): %s\n", len(unaccounted), strings.Join(unaccounted, ", "))
}

func counts(m map[string]int) string {
	return sortedmap.Join(m, "none", ", ", func(k string, n int) string { return fmt.Sprintf("%d %s", n, k) })
}
