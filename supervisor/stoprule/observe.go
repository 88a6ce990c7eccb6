package stoprule

import (
	"strings"
	"time"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// ApplyCall folds one ledger change into a node's stored observations:
// before is the call as stored before the change (nil for a new call),
// after as stored after it. Pure; the shell calls it inside the ledger's
// own transaction, so the counters are exactly the ledger's.
func ApplyCall(o *Observations, before, after *ledger.ToolCall) {
	if after == nil {
		return
	}
	ended := after.State == ledger.CallStateEnded
	if before == nil {
		if after.Resolution == ledger.CallResolutionRejectedDraining {
			bump(&o.CallsByOutcome, outcomeName(after.Resolution), 1)
			return
		}
		o.Calls++
		bump(&o.CallsByTool, toolKey(o.CallsByTool, after.Tool), 1)
		o.CallsInFlight++
		o.CallsInFlightMax = max(o.CallsInFlightMax, o.CallsInFlight)
		if !ended {
			return
		}
	} else if before.State == ledger.CallStateEnded || !ended {
		return // a retried end, or a cancel order: nothing observed ends
	}
	o.CallsInFlight = max(o.CallsInFlight-1, 0)
	bump(&o.CallsByOutcome, outcomeName(after.Resolution), 1)
	if after.Resolution == ledger.CallResolutionFailed {
		o.Failures++
		bump(&o.FailuresByTool, toolKey(o.FailuresByTool, after.Tool), 1)
	}
	if !after.BegunAt.IsZero() && !after.EndedAt.IsZero() {
		d := after.EndedAt.Sub(after.BegunAt)
		if d > 0 {
			s := d.Seconds()
			o.CallSecondsTotal += s
			o.CallSecondsMax = max(o.CallSecondsMax, s)
		}
	}
}

// ApplySpawn folds a spawn into the observations of the child's ancestors:
// the parent spawned one more child, and every ancestor's subtree grew by
// one node reaching (at least) the child's depth below it. get returns an
// ancestor's stored observations for update.
func ApplySpawn(child *tree.Node, get func(nodeID string) *Observations) {
	n := len(child.Ancestors)
	for i, a := range child.Ancestors {
		o := get(a)
		if i == n-1 {
			o.Spawns++
		}
		o.SubtreeSize = max(o.SubtreeSize, 1) + 1
		o.SubtreeDepth = max(o.SubtreeDepth, int64(n-i))
	}
}

// Snapshot completes a node's stored observations with what is read at
// evaluation time: the node itself, its age on the control plane's clock,
// and the lease and revocation counts when the shell fetched them. The
// stored message is not modified.
func Snapshot(stored *Observations, n *tree.Node, now time.Time) *Observations {
	o := &Observations{}
	if stored != nil {
		o = stored.Clone()
	}
	o.SubtreeSize = max(o.SubtreeSize, 1)
	o.Depth = int64(len(n.Ancestors))
	o.NodeName = n.Name
	o.NodeLabels = n.Labels
	if !n.CreatedAt.IsZero() {
		o.AgeSeconds = max(now.Sub(n.CreatedAt).Seconds(), 0)
	}
	return o
}

func bump(m *map[string]int64, k string, by int64) {
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[k] += by
}

// toolKey bounds the tools tracked per node: past MaxTools distinct tools,
// the rest are counted as OtherTool.
func toolKey(m map[string]int64, tool string) string {
	if _, ok := m[tool]; ok || len(m) < MaxTools {
		return tool
	}
	return OtherTool
}

func outcomeName(r ledger.CallResolution) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "CALL_RESOLUTION_"))
}
