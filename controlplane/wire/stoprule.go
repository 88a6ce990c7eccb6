package wire

import (
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// StopRule renders a stop rule.
func StopRule(r *stoprule.Rule) *tetherv1.StopRule {
	if r == nil {
		return nil
	}
	return &tetherv1.StopRule{
		RuleId:      r.RuleID,
		Name:        r.Name,
		Expression:  r.Expression,
		Action:      r.Action,
		SetBy:       r.SetBy,
		NodeId:      r.NodeID,
		Selector:    r.Selector,
		Severity:    r.Severity,
		Labels:      r.Labels,
		CreatedAt:   timestamp(r.CreatedAt),
		Description: r.Description,
		Inherited:   r.Inherited,
	}
}

// StopRules renders stop rules.
func StopRules(rs []*stoprule.Rule) []*tetherv1.StopRule { return each(rs, StopRule) }

// StopRuleFromProto is the inverse of StopRule.
func StopRuleFromProto(p *tetherv1.StopRule) *stoprule.Rule {
	if p == nil {
		return nil
	}
	return &stoprule.Rule{
		RuleID:      p.RuleId,
		Name:        p.Name,
		Expression:  p.Expression,
		Action:      p.Action,
		SetBy:       p.SetBy,
		NodeID:      p.NodeId,
		Selector:    p.Selector,
		Severity:    p.Severity,
		Labels:      p.Labels,
		CreatedAt:   timeOf(p.CreatedAt),
		Description: p.Description,
		Inherited:   p.Inherited,
	}
}

// StopRuleObservations renders a node's observations (TestStopRule's
// observed).
func StopRuleObservations(o *stoprule.Observations) *tetherv1.StopRuleObservations {
	if o == nil {
		return nil
	}
	return &tetherv1.StopRuleObservations{
		Calls:            o.Calls,
		CallsByTool:      o.CallsByTool,
		CallsByOutcome:   o.CallsByOutcome,
		Failures:         o.Failures,
		FailuresByTool:   o.FailuresByTool,
		CallsInFlight:    o.CallsInFlight,
		CallSecondsTotal: o.CallSecondsTotal,
		CallSecondsMax:   o.CallSecondsMax,
		Spawns:           o.Spawns,
		SubtreeSize:      o.SubtreeSize,
		SubtreeDepth:     o.SubtreeDepth,
		Depth:            o.Depth,
		AgeSeconds:       o.AgeSeconds,
		LeasesHeld:       o.LeasesHeld,
		LeasesByState:    o.LeasesByState,
		Revocations:      o.Revocations,
		NodeName:         o.NodeName,
		NodeLabels:       o.NodeLabels,
	}
}

// StopRuleObservationsFromProto is the inverse of StopRuleObservations.
func StopRuleObservationsFromProto(p *tetherv1.StopRuleObservations) *stoprule.Observations {
	if p == nil {
		return nil
	}
	return &stoprule.Observations{
		Calls:            p.Calls,
		CallsByTool:      p.CallsByTool,
		CallsByOutcome:   p.CallsByOutcome,
		Failures:         p.Failures,
		FailuresByTool:   p.FailuresByTool,
		CallsInFlight:    p.CallsInFlight,
		CallSecondsTotal: p.CallSecondsTotal,
		CallSecondsMax:   p.CallSecondsMax,
		Spawns:           p.Spawns,
		SubtreeSize:      p.SubtreeSize,
		SubtreeDepth:     p.SubtreeDepth,
		Depth:            p.Depth,
		AgeSeconds:       p.AgeSeconds,
		LeasesHeld:       p.LeasesHeld,
		LeasesByState:    p.LeasesByState,
		Revocations:      p.Revocations,
		NodeName:         p.NodeName,
		NodeLabels:       p.NodeLabels,
	}
}
