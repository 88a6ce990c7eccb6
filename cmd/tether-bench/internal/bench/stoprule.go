package bench

import (
	"context"
	"fmt"
	"github.com/tetherhq/tether/agentsdk"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("stoprule/evaluate", stopRuleEvaluate)
}

// Expressions of the benchmark's rules: observed counters, a map lookup, a
// comprehension over the tools, a self-reported counter. None becomes true,
// so every rule is evaluated on every change for the whole run.
var benchRuleExpressions = []string{
	`observed.calls_by_tool[?"shell"].orValue(0) > 1000000`,
	`observed.failures >= 100000 && observed.failures * 2 >= observed.calls`,
	`observed.calls_by_tool.exists(t, observed.failures_by_tool[?t].orValue(0) > 100000)`,
	`self_reported.?cost_usd.orValue(0.0) > 1e9 || observed.subtree_size > 1000000`,
}

// stopRuleEvaluate measures stop rules under a steady stream of tool calls
// (BeginCall and EndCall through the real API, 32 gates' worth of
// concurrent clients) on 10,000 agents: once with stop rules disabled
// (no counters, no evaluator: the baseline) and once with 1,000 rules
// attached across the tree (every node inherits at least the root's). It
// reports the calls' throughput both ways, the CPU each call costs more
// with rules (counters in the ledger's transaction plus the evaluations
// the call causes; client and server share the process, so the
// difference is the rules' alone), and the evaluator's throughput: nodes
// and rules evaluated per second and the time one node's evaluation takes.
func stopRuleEvaluate(ctx context.Context, r *Report) error {
	const agents, rules, callers = 10000, 1000, 1000
	base, err := toolCallStream(ctx, r, agents, 0, callers, true)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	with, err := toolCallStream(ctx, r, agents, rules, callers, false)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("stoprule/rules=%d,agents=%d", rules, agents)
	r.Add("stoprule/tool-calls/no-rules", base.rate, "calls/s")
	r.Add(name+"/tool-calls", with.rate, "calls/s")
	if base.cpuPerCall > 0 && with.cpuPerCall > 0 {
		r.Add(name+"/added-cpu-per-call", float64(with.cpuPerCall-base.cpuPerCall)/1e3, "µs")
		r.Add(name+"/cpu-per-call-ratio", float64(with.cpuPerCall)/float64(base.cpuPerCall), "x")
	}
	r.Add(name+"/node-evaluations", with.nodeEvals, "evaluations/s")
	r.Add(name+"/rule-evaluations", with.ruleEvals, "evaluations/s")
	r.Add(name+"/time-per-node-evaluation", with.nanosPerNode/1e3, "µs")
	r.Add(name+"/rules-in-effect-per-node", with.rulesPerNode, "rules")
	return nil
}

type streamResult struct {
	rate                       float64       // calls per second
	cpuPerCall                 time.Duration // process CPU per call
	nodeEvals, ruleEvals       float64       // per second of the measurement
	nanosPerNode, rulesPerNode float64
}

// toolCallStream builds a tree of agents, attaches rules across it, gives
// callers agents a grant, then measures begin-and-end tool calls on them.
func toolCallStream(ctx context.Context, r *Report, agents, rules, callers int, disabled bool) (streamResult, error) {
	srv, err := startServer(ctx, r, func(cfg *controlplane.Config) { cfg.DisableStopRules = disabled })
	if err != nil {
		return streamResult{}, err
	}
	defer srv.Stop()
	root, err := buildSubtree(ctx, srv, agents)
	if err != nil {
		return streamResult{}, err
	}
	nodes, err := srv.Admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root}))
	if err != nil {
		return streamResult{}, err
	}
	all := nodes.Msg.Nodes
	if len(all) != agents {
		return streamResult{}, fmt.Errorf("listed %d of %d agents", len(all), agents)
	}
	for i := range rules {
		node := all[(i*len(all)/rules)%len(all)].NodeId
		if _, err := srv.Admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{
			NodeId: node, Name: fmt.Sprintf("bench-%d", i), Expression: benchRuleExpressions[i%len(benchRuleExpressions)],
		})); err != nil {
			return streamResult{}, err
		}
	}
	tokens := make([]string, callers)
	for i := range tokens {
		node := all[(i*len(all)/callers+3)%len(all)].NodeId
		g, err := srv.Admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			return streamResult{}, err
		}
		tokens[i] = g.Msg.Token
	}
	minted, err := srv.Admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "bench-gate"}))
	if err != nil {
		return streamResult{}, err
	}
	gate := agentsdk.Dial(srv.URL, minted.Msg.Token)
	stats := srv.StopRuleStats()
	// Let the evaluator finish with the tree and the rules first.
	for last := int64(-1); stats != nil && stats.Nodes.Load() != last; time.Sleep(200 * time.Millisecond) {
		last = stats.Nodes.Load()
	}
	var before [3]int64
	if stats != nil {
		before = [3]int64{stats.Nodes.Load(), stats.Evaluations.Load(), stats.EvalNanos.Load()}
	}
	cpuBefore, cpuOK := processCPU()
	start := time.Now()
	const workers = 32
	next := make([]int, workers)
	calls := func(ctx context.Context, w int) error {
		next[w]++
		token := tokens[(w+next[w]*workers)%len(tokens)]
		b, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: []string{"shell", "http", "sql"}[next[w]%3], GateId: "bench-gate"}))
		if err != nil {
			return err
		}
		_, err = gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: b.Msg.Call.CallId, GateId: "bench-gate", Failed: next[w]%7 == 0}))
		return err
	}
	rate, err := Throughput(ctx, workers, r.Duration, calls)
	if err != nil {
		return streamResult{}, err
	}
	elapsed := time.Since(start)
	cpuAfter, _ := processCPU()
	out := streamResult{rate: rate}
	if cpuOK && rate > 0 {
		// The CPU of the whole run (warm-up included) over its calls.
		out.cpuPerCall = time.Duration(float64(cpuAfter-cpuBefore) / (rate * elapsed.Seconds()))
	}
	if stats != nil {
		nodesEvaluated := stats.Nodes.Load() - before[0]
		rulesEvaluated := stats.Evaluations.Load() - before[1]
		nanos := stats.EvalNanos.Load() - before[2]
		out.nodeEvals = float64(nodesEvaluated) / elapsed.Seconds()
		out.ruleEvals = float64(rulesEvaluated) / elapsed.Seconds()
		if nodesEvaluated > 0 {
			out.nanosPerNode = float64(nanos) / float64(nodesEvaluated)
			out.rulesPerNode = float64(rulesEvaluated) / float64(nodesEvaluated)
		}
	}
	return out, nil
}

func init() {
	Register("stoprule/tool-calls-by-depth", toolCallsByDepth)
}

// toolCallsByDepth measures what a tool call costs by the depth of its
// caller: each begun call and failed end adds itself to one subtree record
// per ancestor (observed.subtree_calls), so a call at depth 32 writes 32
// records where one at depth 1 writes one. The calls' rate is bound by
// the store's commits, so the depth shows first in the CPU a call costs
// (client and server share the process). Stop rules are enabled and none
// is attached (the records are kept whether or not a rule reads them);
// 32 workers call from the ends of 32 chains of the depth under one root.
func toolCallsByDepth(ctx context.Context, r *Report) error {
	var shallow time.Duration
	for _, depth := range []int{1, 8, 32} {
		rate, cpu, err := toolCallsAtDepth(ctx, r, depth)
		if err != nil {
			return fmt.Errorf("depth %d: %w", depth, err)
		}
		name := fmt.Sprintf("stoprule/tool-calls/depth=%d", depth)
		r.Add(name, rate, "calls/s")
		if cpu > 0 {
			r.Add(name+"/cpu-per-call", float64(cpu)/1e3, "µs")
		}
		if depth == 1 {
			shallow = cpu
		} else if shallow > 0 && cpu > 0 {
			r.Add(name+"/cpu-per-call-vs-depth=1", float64(cpu)/float64(shallow), "x")
		}
	}
	return nil
}

func toolCallsAtDepth(ctx context.Context, r *Report, depth int) (float64, time.Duration, error) {
	const workers = 32
	srv, err := startServer(ctx, r)
	if err != nil {
		return 0, 0, err
	}
	defer srv.Stop()
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-depth"}))
	if err != nil {
		return 0, 0, err
	}
	tokens := make([]string, workers)
	for w := range tokens {
		node := root.Msg.Node.NodeId
		for range depth {
			child, err := srv.Admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: node, Name: "agent"}))
			if err != nil {
				return 0, 0, err
			}
			node = child.Msg.Node.NodeId
		}
		g, err := srv.Admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			return 0, 0, err
		}
		tokens[w] = g.Msg.Token
	}
	minted, err := srv.Admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "bench-gate"}))
	if err != nil {
		return 0, 0, err
	}
	gate := agentsdk.Dial(srv.URL, minted.Msg.Token)
	next := make([]int, workers)
	calls := func(ctx context.Context, w int) error {
		next[w]++
		b, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: tokens[w], Tool: []string{"shell", "http", "sql"}[next[w]%3], GateId: "bench-gate"}))
		if err != nil {
			return err
		}
		_, err = gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: b.Msg.Call.CallId, GateId: "bench-gate", Failed: next[w]%7 == 0}))
		return err
	}
	cpuBefore, cpuOK := processCPU()
	start := time.Now()
	rate, err := Throughput(ctx, workers, r.Duration, calls)
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start)
	cpuAfter, _ := processCPU()
	var cpu time.Duration
	if cpuOK && rate > 0 {
		cpu = time.Duration(float64(cpuAfter-cpuBefore) / (rate * elapsed.Seconds()))
	}
	return rate, cpu, nil
}
