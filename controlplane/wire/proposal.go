package wire

import (
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// Proposal is a stop proposal as the API carries it.
func Proposal(p *supervisor.StopProposal) *tetherv1.StopProposal {
	if p == nil {
		return nil
	}
	return &tetherv1.StopProposal{
		ProposalId:    p.ProposalID,
		NodeId:        p.NodeID,
		Condition:     p.Condition,
		Reason:        p.Reason,
		State:         tetherv1.ProposalState(p.State),
		ProposedBy:    p.ProposedBy,
		DecidedBy:     p.DecidedBy,
		TerminationId: p.TerminationID,
		CreatedAt:     timestamp(p.CreatedAt),
		DecidedAt:     timestamp(p.DecidedAt),
		Mode:          tetherv1.TerminationMode(p.Mode),
		// A proposal always states its drain window, "0s" included.
		DrainWindow: durationpb.New(p.DrainWindow),
		Rule:        StopRuleFiring(p.Rule),
	}
}

// Proposals is Proposal of each.
func Proposals(ps []*supervisor.StopProposal) []*tetherv1.StopProposal { return each(ps, Proposal) }

// StopRuleFiring is a stop rule's firing as a proposal and a record carry
// it.
func StopRuleFiring(f *supervisor.StopRuleFiring) *tetherv1.StopRuleFiring {
	if f == nil {
		return nil
	}
	return &tetherv1.StopRuleFiring{
		RuleId:       f.RuleID,
		Name:         f.Name,
		Expression:   f.Expression,
		SetBy:        f.SetBy,
		Severity:     f.Severity,
		Labels:       f.Labels,
		RuleNodeId:   f.RuleNodeID,
		NodeId:       f.NodeID,
		Values:       StopRuleValues(f.Values),
		SelfReported: f.SelfReported,
		FiredAt:      timestamp(f.FiredAt),
		Action:       f.Action,
	}
}

// StopRuleValues are the values a stop rule read, as the API carries them.
func StopRuleValues(vs []supervisor.StopRuleValue) []*tetherv1.StopRuleValue {
	return each(vs, func(v supervisor.StopRuleValue) *tetherv1.StopRuleValue {
		return &tetherv1.StopRuleValue{Name: v.Name, Value: v.Value, SelfReported: v.SelfReported}
	})
}
