package console

import (
	"html/template"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/sortedmap"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// enumName turns "NODE_STATE_RUNNING" into "running" given the prefix.
func enumName(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" {
		return ""
	}
	return strings.ToLower(s)
}

func nodeState(s tetherv1.NodeState) string { return enumName(s.String(), "NODE_STATE_") }

func termState(s tetherv1.TerminationState) string {
	return enumName(s.String(), "TERMINATION_STATE_")
}

func grantState(s tetherv1.GrantState) string { return enumName(s.String(), "GRANT_STATE_") }

func roleName(r tetherv1.Role) string { return enumName(r.String(), "ROLE_") }

func templateFuncs() template.FuncMap {
	return template.FuncMap{
		"nodeState":  nodeState,
		"termState":  termState,
		"grantState": grantState,
		"mode":       func(m tetherv1.TerminationMode) string { return enumName(m.String(), "TERMINATION_MODE_") },
		"outcome":    func(o tetherv1.NodeOutcome) string { return enumName(o.String(), "NODE_OUTCOME_") },
		"resolution": func(r tetherv1.CallResolution) string { return enumName(r.String(), "CALL_RESOLUTION_") },
		"callState":  func(s tetherv1.CallState) string { return enumName(s.String(), "CALL_STATE_") },
		"privOutcome": func(o tetherv1.PrivilegeOutcome) string {
			return enumName(o.String(), "PRIVILEGE_OUTCOME_")
		},
		"leaseOutcome":  func(o tetherv1.LeaseOutcome) string { return enumName(o.String(), "LEASE_OUTCOME_") },
		"leaseState":    func(s tetherv1.LeaseState) string { return enumName(s.String(), "LEASE_STATE_") },
		"result":        func(s tetherv1.TerminalResult) string { return enumName(s.String(), "TERMINAL_RESULT_") },
		"proposalState": func(s tetherv1.ProposalState) string { return enumName(s.String(), "PROPOSAL_STATE_") },
		"rolloutState":  func(s tetherv1.RolloutState) string { return enumName(s.String(), "ROLLOUT_STATE_") },
		"batchState":    func(s tetherv1.RolloutBatchState) string { return enumName(s.String(), "ROLLOUT_BATCH_STATE_") },
		"ts":            ts,
		"dur":           dur,
		"labels":        labels,
		"join":          strings.Join,
		"pct": func(done, total uint32) uint32 {
			if total == 0 {
				return 0
			}
			return done * 100 / total
		},
		"add": func(a, b uint32) uint32 { return a + b },
	}
}

// ts renders a timestamp in UTC to the second; "—" when unset.
func ts(t *timestamppb.Timestamp) string {
	if t == nil || (t.Seconds == 0 && t.Nanos == 0) {
		return "—"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
}

func dur(d *durationpb.Duration) string {
	if d == nil {
		return "—"
	}
	return d.AsDuration().Round(time.Millisecond).String()
}

// labels renders a label map as "k=v, k2=v2", sorted.
func labels(m map[string]string) string {
	return sortedmap.Join(m, "", ", ", func(k, v string) string { return k + "=" + v })
}
