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
