package tree

import (
	"testing"

	"github.com/tetherhq/tether/internal/enumname/enumtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The states and signal kinds carry tether.v1's numbers (the RPC edge
// converts them with a cast, and the stored nodes hold them), and String
// returns tether.v1's names, which StateName, the metrics and the record
// show: every value of the generated enum is pinned.
func TestNodeStateIsTetherV1s(t *testing.T) {
	enumtest.Pin(t, "NodeState", tetherv1.NodeState_name, len(nodeStateNames), func(v int32) string { return NodeState(v).String() })
	for s, want := range map[NodeState]tetherv1.NodeState{
		NodeStateUnspecified: tetherv1.NodeState_NODE_STATE_UNSPECIFIED,
		NodeStateRunning:     tetherv1.NodeState_NODE_STATE_RUNNING,
		NodeStateDraining:    tetherv1.NodeState_NODE_STATE_DRAINING,
		NodeStateAborting:    tetherv1.NodeState_NODE_STATE_ABORTING,
		NodeStateTerminated:  tetherv1.NodeState_NODE_STATE_TERMINATED,
		NodeStateExited:      tetherv1.NodeState_NODE_STATE_EXITED,
	} {
		if int32(s) != int32(want) {
			t.Errorf("%v = %d, tether.v1 says %d", s, s, want)
		}
	}
	if got := StateName(NodeStateExited); got != "exited" {
		t.Errorf("StateName(NodeStateExited) = %q, want exited", got)
	}
}

func TestSignalKindIsTetherV1s(t *testing.T) {
	enumtest.Pin(t, "SignalKind", tetherv1.SignalKind_name, len(signalKindNames), func(v int32) string { return SignalKind(v).String() })
	for k, want := range map[SignalKind]tetherv1.SignalKind{
		SignalKindUnspecified: tetherv1.SignalKind_SIGNAL_KIND_UNSPECIFIED,
		SignalKindDrain:       tetherv1.SignalKind_SIGNAL_KIND_DRAIN,
		SignalKindAbort:       tetherv1.SignalKind_SIGNAL_KIND_ABORT,
	} {
		if int32(k) != int32(want) {
			t.Errorf("%v = %d, tether.v1 says %d", k, k, want)
		}
	}
}
