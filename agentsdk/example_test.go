package agentsdk_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/embedded"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// controlPlane starts an embedded control plane for an example and returns
// an operator connection to it.
func controlPlane() (*agentsdk.Conn, func()) {
	dir, err := os.MkdirTemp("", "agentsdk-example-")
	if err != nil {
		panic(err)
	}
	srv, err := embedded.Start(context.Background(), dir)
	if err != nil {
		panic(err)
	}
	return agentsdk.Dial(srv.URL, srv.AdminToken), func() { srv.Stop(); os.RemoveAll(dir) }
}

// An operator registers a root agent; the agent spawns a child and hands it
// the credential; the child's process joins with it.
func Example_registerAndSpawn() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	planner, err := agentsdk.RegisterRoot(ctx, operator, "planner", map[string]string{"team": "research"})
	if err != nil {
		panic(err)
	}
	child, err := planner.Spawn(ctx, "retriever", nil)
	if err != nil {
		panic(err)
	}
	// In the child's process:
	retriever, err := agentsdk.Join(ctx, operator.BaseURL, child.Credential, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(retriever.Node().Name, "is a child of", planner.Node().Name+":", retriever.Node().ParentNodeId == planner.NodeID())

	// An agent cannot grow someone else's subtree.
	other, _ := agentsdk.RegisterRoot(ctx, operator, "other", nil)
	_, err = retriever.Spawn(ctx, "x", nil)
	fmt.Println("spawn under itself:", err == nil)
	_, err = other.Conn().Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: planner.NodeID(), Name: "intruder"}))
	fmt.Println("spawn under another agent:", connect.CodeOf(err))
	// Output:
	// retriever is a child of planner: true
	// spawn under itself: true
	// spawn under another agent: permission_denied
}

// A parent delegates an attenuated grant to its child: fewer scopes, never
// longer than its own. Asking for more is refused, naming the scope.
func ExampleAgent_Delegate() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	planner, _ := agentsdk.RegisterRoot(ctx, operator, "planner", nil)
	root, err := operator.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: planner.NodeID(), Scopes: []string{"tool:shell", "tool:http"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		panic(err)
	}
	child, _ := planner.Spawn(ctx, "fetcher", nil)

	grant, err := planner.Delegate(ctx, root.Msg.Grant.GrantId, child.Node.NodeId, []string{"tool:http"}, 10*time.Minute)
	if err != nil {
		panic(err)
	}
	fmt.Println("delegated:", grant.Scopes, "chain length", len(grant.Chain))

	_, err = planner.Delegate(ctx, root.Msg.Grant.GrantId, child.Node.NodeId, []string{"tool:*"}, 0)
	fmt.Println("escalation:", connect.CodeOf(err))
	// Output:
	// delegated: [tool:http] chain length 1
	// escalation: permission_denied
}

// A tool server guards its tool with a ToolGate: the control plane verifies
// the caller's capability token and records the call; a revoked token is
// refused before the handler runs.
func ExampleToolGate() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	agent, _ := agentsdk.RegisterRoot(ctx, operator, "worker", nil)
	root, _ := operator.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: agent.NodeID(), Scopes: []string{"tool:shell"}, Ttl: durationpb.New(time.Hour),
	}))
	// The gate reports as a tool server, with its own token: never the
	// agent's credential.
	minted, err := operator.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "shell-gate"}))
	if err != nil {
		panic(err)
	}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, minted.Msg.Token, agentsdk.WithHTTPClient(operator.HTTP)), "shell-gate")
	defer gate.Close()
	<-gate.Ready()

	err = gate.Call(ctx, root.Msg.Token, "shell", func(ctx context.Context) error {
		fmt.Println("running the command")
		return nil
	})
	fmt.Println("call:", err)

	if _, err := operator.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: root.Msg.Grant.GrantId}})); err != nil {
		panic(err)
	}
	err = gate.Call(ctx, root.Msg.Token, "shell", func(ctx context.Context) error {
		fmt.Println("never printed")
		return nil
	})
	fmt.Println("after revocation:", connect.CodeOf(err))
	// Output:
	// running the command
	// call: <nil>
	// after revocation: permission_denied
}

// An agent loop: work until the control plane says drain, finish what is in
// hand, then confirm the exit. Abort would also cancel agent.Context().
func ExampleAgent_Draining() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	agent, _ := agentsdk.RegisterRoot(ctx, operator, "worker", nil)
	// OnDrain's callbacks run once Draining() is closed, on a goroutine of
	// their own: hand the signal to the loop rather than print from there.
	signals := make(chan agentsdk.Signal, 1)
	agent.OnDrain(func(s agentsdk.Signal) { signals <- s })
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go agent.Run(runCtx)
	<-agent.Opened()

	// An operator stops the agent's subtree.
	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(time.Minute),
	}))
	if err != nil {
		panic(err)
	}

	// The agent's loop.
	for done := false; !done; {
		select {
		case <-agent.Draining():
			fmt.Println("signal: abort =", (<-signals).Abort)
			fmt.Println("draining: finishing the current step, starting nothing new")
			if err := agent.Exit(ctx, "drained"); err != nil {
				panic(err)
			}
			done = true
		case <-time.After(10 * time.Millisecond):
			// one step of work
		}
	}

	stream, _ := operator.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.Msg.Termination.TerminationId}))
	for stream.Receive() {
		if t := stream.Msg().Termination; t.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
			rec, _ := operator.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: t.RecordId}))
			fmt.Println("record:", rec.Msg.Record.Nodes[0].Outcome)
			break
		}
	}
	stream.Close()
	// Output:
	// signal: abort = false
	// draining: finishing the current step, starting nothing new
	// record: NODE_OUTCOME_CONFIRMED
}

// A worker accepts a job lease, reports progress and its result; a tool
// server fences side effects by generation, so a worker whose lease was
// reassigned can no longer write.
func ExampleLeaseWorker() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	agent, _ := agentsdk.RegisterRoot(ctx, operator, "worker", nil)
	offer, err := operator.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
		JobId: "index-docs", HolderIdentity: agent.NodeID(), LeaseDuration: durationpb.New(time.Minute),
	}))
	if err != nil {
		panic(err)
	}
	spool, _ := os.MkdirTemp("", "spool-")
	defer os.RemoveAll(spool)
	worker, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: agent.Conn(), SpoolDir: spool})
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	job, decision, err := worker.Accept(ctx, offer.Msg.Lease, agentsdk.JobOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("ack:", decision.Outcome, "generation", job.Lease().LeaseGeneration)

	var fence agentsdk.Fence
	fmt.Println("write with generation 1:", fence.Admit("index-docs", 1))
	fence.Observe("index-docs", 2) // the job was reassigned elsewhere
	fmt.Println("write with generation 1 after reassignment:", fence.Admit("index-docs", 1) != nil)

	d, _ := job.Progress(ctx, "50%")
	fmt.Println("progress:", d.Outcome)
	d, _ = job.Complete(ctx, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "indexed 120 documents")
	fmt.Println("complete:", d.Outcome)
	// Output:
	// ack: OUTCOME_ACCEPTED generation 1
	// write with generation 1: <nil>
	// write with generation 1 after reassignment: true
	// progress: OUTCOME_ACCEPTED
	// complete: OUTCOME_ACCEPTED
}

// An agent writes when it should stop: a stop rule over what the control
// plane observes, and one over the cost it reports itself. When a rule
// becomes true the control plane files a stop proposal naming the rule and
// the values, labelling the agent's own numbers self-reported; the
// operator's policy decides. A child cannot remove its parent's rule.
func ExampleAgent_AddStopRule() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	planner, _ := agentsdk.RegisterRoot(ctx, operator, "planner", nil)
	child, _ := planner.Spawn(ctx, "worker", nil)
	worker, _ := agentsdk.Join(ctx, operator.BaseURL, child.Credential, nil)

	// The planner bounds its worker's subtree; the worker bounds its cost.
	spawns, err := planner.AddStopRule(ctx, worker.NodeID(), agentsdk.StopRule{Name: "spawn-cap", Expression: `observed.subtree_size > 50`})
	if err != nil {
		panic(err)
	}
	_, err = worker.AddStopRule(ctx, "", agentsdk.StopRule{Name: "cost-cap", Expression: `self_reported.?cost_usd.orValue(0.0) > 5.0`, Severity: "critical"})
	fmt.Println("rule added:", err == nil)
	_, err = worker.Conn().StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: spawns.RuleId}))
	fmt.Println("the worker removes its parent's rule:", connect.CodeOf(err))
	_, err = worker.AddStopRule(ctx, "", agentsdk.StopRule{Name: "bad", Expression: `observed.calls >`})
	fmt.Println(connect.CodeOf(err), strings.Contains(err.Error(), "1:17"))

	if err := worker.ReportCounters(ctx, map[string]float64{"cost_usd": 6.25}); err != nil {
		panic(err)
	}
	for {
		resp, err := operator.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
		if err != nil {
			panic(err)
		}
		if len(resp.Msg.Proposals) > 0 {
			p := resp.Msg.Proposals[0]
			v := p.Rule.Values[0]
			fmt.Printf("proposal for the worker: %v, rule %s, %s = %s, self-reported %v\n", p.NodeId == worker.NodeID(), p.Rule.Name, v.Name, v.Value, v.SelfReported)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Output:
	// rule added: true
	// the worker removes its parent's rule: permission_denied
	// invalid_argument true
	// proposal for the worker: true, rule cost-cap, self_reported.cost_usd = 6.25, self-reported true
}

// A grant lives for hours, each of its tokens for minutes: an agent takes
// its token from a CapabilityToken, which refreshes it (the control plane
// re-checks the chain) before it expires; once the grant is revoked, Token
// returns the refusal instead.
func ExampleAgent_CapabilityTokenFor() {
	ctx := context.Background()
	operator, stop := controlPlane()
	defer stop()

	agent, _ := agentsdk.RegisterRoot(ctx, operator, "worker", nil)
	root, _ := operator.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: agent.NodeID(), Scopes: []string{"tool:http"}, Ttl: durationpb.New(8 * time.Hour),
	}))
	capability, err := agent.CapabilityTokenFor(ctx, root.Msg.Grant.GrantId)
	if err != nil {
		panic(err)
	}
	token, err := capability.Token(ctx) // call before each use
	fmt.Println("token:", token != "", err)
	fmt.Println("token outlives the grant:", capability.Grant().ExpiresAt.After(root.Msg.Grant.ExpiresAt.AsTime()))
	// Output:
	// token: true <nil>
	// token outlives the grant: false
}
