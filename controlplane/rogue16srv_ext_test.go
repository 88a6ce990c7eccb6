package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixteenth hostile pass on the server's resources.
//
// TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel:
// a lineage's open streams are bounded together (--max-streams-per-lineage)
// and each node had a reserve of its own for its signal streams only, so
// one member could hold the whole share and keep every sibling's other
// streams out: an honest sibling's lease Channel, on which it acks and
// renews the jobs it holds, was refused resource_exhausted until the rogue
// closed some. Each node now also has a small reserve of its own for
// streams of other kinds (controlplane.StreamReserve), which a stream
// takes from first: the sibling opens its Channel and a watch, and works
// its lease over the Channel; a third stream past its reserve is refused
// (the share is still held), and the lineage holds no more than its share
// and its nodes' reserves, however many of its members open streams.

// TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel:
// see the file's header.
func TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel(t *testing.T) {
	const perCaller, share = 12, 4
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.Conn.MaxStreamsPerCaller = perCaller
		cfg.Conn.MaxStreamsPerLineage = share
	})
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	rootC := srv.Clients(root.Credential)
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogueC, honestC := srv.Clients(rogue.Credential), srv.Clients(honest.Credential)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	// revocations opens a revocation feed and waits for the server's
	// first message, which says it was admitted.
	revocations := func(c *testserver.Clients) error {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.Capability.WatchRevocations(sctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err == nil && !stream.Receive() {
			err = stream.Err()
		}
		if err != nil {
			scancel()
			return err
		}
		closers = append(closers, func() { scancel(); _ = stream.Close() })
		return nil
	}
	refused := func(what string, err error, node string) {
		t.Helper()
		wantLimit(t, what, err, connect.CodeResourceExhausted, "lineage "+root.Node.NodeId, "--max-streams-per-lineage")
		if node != honest.Node.NodeId && strings.Contains(err.Error(), honest.Node.NodeId) {
			t.Fatalf("%s: the refusal %q names the honest sibling, a node the caller did not ask about", what, err)
		}
	}

	// The rogue opens feeds up to its own cap: its reserve and the whole
	// share are admitted, the rest refused.
	held := 0
	for range perCaller {
		if err := revocations(rogueC); err != nil {
			refused("a rogue's feed past its lineage's share", err, rogue.Node.NodeId)
			continue
		}
		held++
	}

	// The honest sibling works the job it holds over its lease Channel.
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-honest", HolderIdentity: honest.Node.NodeId,
		LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	ch := openChannel(t, honestC)
	l, d, errText := ch.tryOpen(ack(offered.Msg.Lease))
	if errText != "" {
		t.Fatalf("the honest sibling's lease Channel, its lineage's share held by the rogue: %s", errText)
	}
	wantDecision(t, "the sibling's ACK on its Channel", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	clk.Advance(10 * time.Second)
	_, d, errText = ch.tryOpen(renew(l, 1))
	if errText != "" {
		t.Fatalf("the sibling's renewal on its Channel: %s", errText)
	}
	wantDecision(t, "the sibling's renewal on its Channel", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	if want := share + controlplane.StreamReserve; held != want {
		t.Fatalf("the rogue holds %d feeds, want its lineage's share of %d and its node's reserve of %d", held, share, controlplane.StreamReserve)
	}
	// And a watch beside it; a third stream is past its reserve.
	if err := revocations(honestC); err != nil {
		t.Fatalf("the sibling's second stream, within its node's reserve: %v", err)
	}
	refused("the sibling's third stream, past its node's reserve with the share held", revocations(honestC), honest.Node.NodeId)

	// A swarm holds its share and its nodes' reserves, no more: the root
	// too opens what it can.
	for range perCaller {
		if err := revocations(rootC); err != nil {
			refused("the root's feed past its lineage's share", err, root.Node.NodeId)
		}
	}
	if got, want := srv.OpenLineageStreams(root.Node.NodeId), share+3*controlplane.StreamReserve; got != want {
		t.Fatalf("the lineage holds %d open streams, want its share and its 3 nodes' reserves, %d", got, want)
	}
	// The signal streams keep their own reserve beside the other one.
	if _, err := openSession(t, honestC, honest.Node.NodeId); err != nil {
		t.Fatalf("the sibling's session beside its Channel and its watch: %v", err)
	}
}

// tryOpen sends m on a Channel that may be refused as it opens: the
// refusal comes back as the error text, not a fatal error.
func (c *channel) tryOpen(m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string) {
	c.next++
	m.CorrelationId = c.next
	if err := c.stream.Send(m); err != nil {
		if _, rerr := c.stream.Receive(); rerr != nil {
			return nil, nil, rerr.Error()
		}
		return nil, nil, err.Error()
	}
	resp, err := c.stream.Receive()
	if err != nil {
		return nil, nil, err.Error()
	}
	return resp.Lease, resp.Decision, resp.Error
}

// TestARogueCompilingStopRulesPaysForTheirSize: an agent's TestStopRule
// and AddStopRule compile the expression it sends, up to 2 KiB
// (stoprule.MaxExpressionBytes): 7–8 ms of the server's CPU and 2.6 MB
// allocated for one request of its lineage's budget, what about twenty
// spawns cost, with a fresh expression each time to miss the cache of
// compiled ones. (The compiles also ran one at a time under the cache's
// lock, the cluster's rule evaluator's among them.) An expression now
// costs one request per controlplane.RuleBytesPerRequest bytes besides the
// call's own, charged before it is parsed: a rogue with a budget of 200
// compiles six expressions of 2 KiB, not two hundred; the refusal names
// its lineage, the size and the price, and stores nothing; a short
// expression still costs one request; another tree compiles its own on
// its own budget.
func TestARogueCompilingStopRulesPaysForTheirSize(t *testing.T) {
	const burst = 200
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, burst })
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	other := register(t, admin, "neighbour")
	rogue, neighbour := srv.Clients(root.Credential), srv.Clients(other.Credential)
	ctx := context.Background()

	// long is an expression of close to 2 KiB, a different one for each i.
	long := func(i int) string {
		var b strings.Builder
		b.WriteString("observed.age_seconds > " + strconv.Itoa(i) + ".0")
		for j := 0; b.Len() < 2000; j++ {
			b.WriteString(" || self_reported.?k" + strconv.Itoa(j) + ".orValue(0.0) > " + strconv.Itoa(j) + ".0")
		}
		return b.String()
	}
	price := 1 + len(long(0))/controlplane.RuleBytesPerRequest
	want := burst / price
	compiled := 0
	var refusal error
	for i := range want + 2 {
		_, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, Expression: long(i)}))
		if err != nil {
			refusal = err
			break
		}
		compiled++
	}
	if compiled != want {
		t.Fatalf("the rogue compiled %d expressions of %d bytes on a budget of %d, want %d (each costs %d requests)", compiled, len(long(0)), burst, want, price)
	}
	wantLimit(t, "a compile past the lineage's budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId, strconv.Itoa(len(long(want)))+" bytes", strconv.Itoa(price-1)+" requests")
	_, err := rogue.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "long", Expression: long(100)}))
	wantLimit(t, "a rule past the lineage's budget", err, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
	rules, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: root.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules.Msg.Rules) != 0 {
		t.Fatalf("the refused rule was stored: %v", rules.Msg.Rules)
	}
	// What is left of the budget still compiles a short expression.
	if _, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, Expression: "observed.age_seconds > 3600.0"})); err != nil {
		t.Fatalf("a short expression with %d requests of the budget left: %v", burst-want*price, err)
	}
	// Another tree compiles on its own budget.
	for i := range want {
		if _, err := neighbour.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: other.Node.NodeId, Expression: long(1000 + i)})); err != nil {
			t.Fatalf("another tree's expression %d: %v", i+1, err)
		}
	}
}

// TestARogueCannotRepeatTheStopOfItsSubtree: an agent may stop its own
// subtree, and its repeated request (a drain over its own drain) was a new
// termination that took every node over again — marking the whole subtree,
// writing each node and the termination's index of members — for one
// request of its lineage's budget: 60–80 ms of the server's CPU per repeat
// of a 1,001-node subtree on the loaded test machine, and a new record's
// worth of store each time, as often as its budget allowed, the subtree
// paid for once. An agent's own repeat that does not escalate is now
// refused failed_precondition naming its earlier termination, and nothing
// is written: a drain again (of the node or of one inside it), an abort
// again (every node stays with the termination it had). An abort still
// escalates the agent's drain, once; an operator's
// repeat (a client's retry) still takes the nodes over.
func TestARogueCannotRepeatTheStopOfItsSubtree(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)
	mid := spawn(t, rogue, root.Node.NodeId, "mid")
	children := make([]*tetherv1.SpawnBatchChild, 50)
	for i := range children {
		children[i] = &tetherv1.SpawnBatchChild{Name: "leaf-" + strconv.Itoa(i)}
	}
	leaves, err := srv.Clients(mid.Credential).Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: mid.Node.NodeId, Children: children}))
	if err != nil {
		t.Fatal(err)
	}
	leaf := leaves.Msg.Spawned[7].Node.NodeId
	stop := func(c *testserver.Clients, node string, mode tetherv1.TerminationMode) (*tetherv1.Termination, error) {
		resp, err := c.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
			NodeId: node, Mode: mode, Reason: "stop",
			DrainWindow: durationpb.New(time.Hour), CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
		}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Termination, nil
	}
	marked := func(term *tetherv1.Termination) {
		t.Helper()
		testserver.WaitFor(t, 30*time.Second, "termination "+term.TerminationId+" to mark the subtree", func() bool {
			return getTermination(t, admin, term.TerminationId).Progress.GetNodesMarked() == 51
		})
	}
	repeated := func(what string, node string, mode tetherv1.TerminationMode, own string) {
		t.Helper()
		_, err := stop(rogue, node, mode)
		wantLimit(t, what, err, connect.CodeFailedPrecondition, node, "your own termination "+own, "nothing more")
		for _, n := range []string{node, mid.Node.NodeId, leaf} {
			if got := nodeTermination(t, admin, n); got != own {
				t.Fatalf("%s: node %s is stopped by %s, want still %s", what, n, got, own)
			}
		}
	}

	drain, err := stop(rogue, mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN)
	if err != nil {
		t.Fatalf("the agent drains its subtree: %v", err)
	}
	marked(drain)
	repeated("the agent's drain of its subtree again", mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, drain.TerminationId)
	repeated("the agent's drain of a node inside it", leaf, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, drain.TerminationId)

	abort, err := stop(rogue, mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	if err != nil {
		t.Fatalf("the agent escalates its drain to an abort: %v", err)
	}
	marked(abort)
	repeated("the agent's abort again", mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, abort.TerminationId)
	repeated("the agent's drain over its abort", mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, abort.TerminationId)

	// An operator's stop, and its repeat, still take the nodes over.
	op, err := stop(admin, mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	if err != nil {
		t.Fatal(err)
	}
	marked(op)
	again, err := stop(admin, mid.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	if err != nil {
		t.Fatalf("an operator's repeated abort: %v", err)
	}
	marked(again)
	if got := nodeTermination(t, admin, mid.Node.NodeId); got != again.TerminationId {
		t.Fatalf("the operator's repeat: the node is stopped by %s, want %s", got, again.TerminationId)
	}
}
