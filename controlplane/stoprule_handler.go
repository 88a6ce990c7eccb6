package controlplane

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// stopRuleService is the edge of supervisor/stoprule. The policy admits
// agents to AddStopRule, RemoveStopRule, ListStopRules and TestStopRule;
// the attenuation rule narrows them to their own subtree (and, for
// removal, to rules they or their descendants set). ReportCounters is
// agents only, about themselves.
type stopRuleService struct {
	tetherv1connect.UnimplementedStopRuleServiceHandler
	s *Server
}

// actor reads the caller fail-closed.
func (h *stopRuleService) actor(ctx context.Context) (stoprule.Actor, error) {
	if h.s.stopRules == nil {
		return stoprule.Actor{}, connect.NewError(connect.CodeUnavailable, errors.New("stop rules are disabled on this server"))
	}
	p, ok := auth.FromContext(ctx)
	if !ok {
		return stoprule.Actor{}, connect.NewError(connect.CodeUnauthenticated, auth.ErrNoCredential)
	}
	a := stoprule.Actor{ID: p.ID()}
	if p.IsAgent() {
		a.NodeID = p.NodeID()
	}
	return a, nil
}

// RuleBytesPerRequest is how many bytes of a stop rule's expression one
// request of the caller's rate budget pays to compile: AddStopRule and
// TestStopRule with an expression cost 1 + len(expression)/64 requests.
// Compiling (parse, type and cost checks) grows faster than the text: an
// expression of 2 KiB (stoprule.MaxExpressionBytes) took 7–8 ms of CPU
// and allocated 2.6 MB, what about twenty spawns cost, one of a few dozen
// bytes 0.2–0.3 ms (docs/capacity.md, "Compiling a stop rule"); the price
// leaves room for the garbage collection the allocations bring.
const RuleBytesPerRequest = 64

// SubtreeToolBytesPerRequest is how many bytes of a subtree's records
// that hold names (the counts by tool, observed.subtree_calls_by_tool and
// subtree_failures_by_tool; the reported counters, subtree_reported) one
// request of the caller's budget pays to decode when TestStopRule's
// expression reads them: taken once they are read, even past what the
// budget has left (auth.SpendDone). A node's 256 records filled with 64
// tools of 128 characters, some 2.8 MB, took a quarter of a second to
// decode and add up on the loaded test machine: about 690 requests, as
// compiling is priced (RuleBytesPerRequest), and as the evaluator charges
// them to its tree's turns. The node's growth and call totals, read for
// every expression, are priced so past their first 4 KiB (some ninety
// records; up to 512 a rogue fills, a child in each shard, some 22 KB).
const SubtreeToolBytesPerRequest = 4096

// chargeExpression charges the caller's budget for compiling expression,
// beyond the request the Gate charged, before any of it is parsed. It
// charges the same whether the expression was compiled before or not, so
// that a caller learns nothing of other trees' rules from its charge.
func chargeExpression(ctx context.Context, expression string) error {
	n := len(expression) / RuleBytesPerRequest
	if n == 0 {
		return nil
	}
	if err := auth.Spend(ctx, n); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			out := connect.NewError(ce.Code(), fmt.Errorf("an expression of %d bytes costs %d requests to compile (one per %d bytes, beside the call's own): %s", len(expression), n, RuleBytesPerRequest, ce.Message()))
			for k, v := range ce.Meta() {
				out.Meta()[k] = v
			}
			return out
		}
		return err
	}
	return nil
}

func (h *stopRuleService) AddStopRule(ctx context.Context, req *connect.Request[tetherv1.AddStopRuleRequest]) (*connect.Response[tetherv1.AddStopRuleResponse], error) {
	a, err := h.actor(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if err := chargeExpression(ctx, m.Expression); err != nil {
		return nil, err
	}
	rule := &stoprule.Rule{
		NodeID: m.NodeId, Name: m.Name, Expression: m.Expression, Action: m.Action,
		Severity: m.Severity, Labels: m.Labels, Description: m.Description,
	}
	if m.LabelSelector != "" {
		sel, err := tree.ParseSelector(m.LabelSelector)
		if err != nil {
			return nil, toConnect(err)
		}
		rule.Selector = sel
	}
	// An agent's rule is checked against the rules of its allotment at
	// the node, each compiled again when this replica does not hold it
	// (the cache is bounded and cleared when full): each such compile is
	// priced as its expression, or a rogue that cycled the cache and
	// removed and re-added a rule at a node holding its allotment had
	// each add compile the allotment for one rule's price.
	stored, compiled, err := h.s.stopRules.AddPriced(ctx, a, rule, func(attached string) error {
		return chargeExpression(ctx, attached)
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.AddStopRuleResponse{Rule: wire.StopRule(stored), EstimatedCost: compiled.Cost, CostBudget: stoprule.CostBudget}), nil
}

func (h *stopRuleService) ListStopRules(ctx context.Context, req *connect.Request[tetherv1.ListStopRulesRequest]) (*connect.Response[tetherv1.ListStopRulesResponse], error) {
	a, err := h.actor(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.PageSize < 0 {
		return nil, invalid("page_size must not be negative")
	}
	// A page at a time (at most stoprule.MaxListPage rules, under 4 MiB),
	// each a request of the caller's budget: a rogue that filled its
	// chain with its allotments of the largest rules had one request list
	// them all, over 4 MiB for 1,664 rules, past the SDKs' 16 MiB for a
	// full chain, which no operator could then list.
	rules, next, err := h.s.stopRules.ListPage(ctx, a, req.Msg.NodeId, req.Msg.PageToken, int(req.Msg.PageSize))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ListStopRulesResponse{Rules: wire.StopRules(rules), NextPageToken: next}), nil
}

func (h *stopRuleService) RemoveStopRule(ctx context.Context, req *connect.Request[tetherv1.RemoveStopRuleRequest]) (*connect.Response[tetherv1.RemoveStopRuleResponse], error) {
	a, err := h.actor(ctx)
	if err != nil {
		return nil, err
	}
	rule, err := h.s.stopRules.Remove(ctx, a, req.Msg.RuleId)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RemoveStopRuleResponse{Rule: wire.StopRule(rule)}), nil
}

func (h *stopRuleService) TestStopRule(ctx context.Context, req *connect.Request[tetherv1.TestStopRuleRequest]) (*connect.Response[tetherv1.TestStopRuleResponse], error) {
	a, err := h.actor(ctx)
	if err != nil {
		return nil, err
	}
	if (req.Msg.Expression == "") == (req.Msg.RuleId == "") {
		return nil, invalid("exactly one of expression and rule_id is required")
	}
	if err := chargeExpression(ctx, req.Msg.Expression); err != nil {
		return nil, err
	}
	// A stored rule named by id is priced as its expression, once the
	// caller may test it and before it is compiled, whether or not this
	// replica holds it compiled: the cache is bounded and cleared when
	// full, and a rogue that cycled through more stored rules than it
	// holds had each test compile up to 2 KiB for the call alone (its
	// author's payment bought one compile, not one per test). Only rules
	// the caller may test are priced (it may list them, their
	// expressions included): another tree's is not found first.
	res, err := h.s.stopRules.TestPriced(ctx, a, req.Msg.NodeId, req.Msg.Expression, req.Msg.RuleId, func(stored string) error {
		return chargeExpression(ctx, stored)
	})
	if err != nil {
		return nil, toConnect(err)
	}
	auth.SpendDone(ctx, res.DecodedBytes/SubtreeToolBytesPerRequest)
	resp := &tetherv1.TestStopRuleResponse{
		Result: res.Fired, Values: wire.StopRuleValues(res.Values), Observed: wire.StopRuleObservations(res.Observed), SelfReported: res.SelfReported, Cost: res.Cost,
	}
	if res.Err != nil {
		resp.Error = res.Err.Error()
	}
	return connect.NewResponse(resp), nil
}

func (h *stopRuleService) ReportCounters(ctx context.Context, req *connect.Request[tetherv1.ReportCountersRequest]) (*connect.Response[tetherv1.ReportCountersResponse], error) {
	a, err := h.actor(ctx)
	if err != nil {
		return nil, err
	}
	counters, err := h.s.stopRules.Report(ctx, a, req.Msg.NodeId, req.Msg.Counters)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ReportCountersResponse{Counters: counters}), nil
}
