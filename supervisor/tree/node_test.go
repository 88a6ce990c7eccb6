package tree

import (
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The states and signal kinds carry tether.v1's numbers (the RPC edge
// converts them with a cast, and the stored nodes hold them), and String
// returns tether.v1's names, which StateName, the metrics and the record
// show: every value of the generated enum is pinned.
func TestNodeStateIsTetherV1s(t *testing.T) {
	if len(nodeStateNames) != len(tetherv1.NodeState_name) {
		t.Fatalf("%d node states, tether.v1 has %d", len(nodeStateNames), len(tetherv1.NodeState_name))
	}
	for v, name := range tetherv1.NodeState_name {
		if got := NodeState(v).String(); got != name {
			t.Errorf("NodeState(%d).String() = %q, want %q", v, got, name)
		}
	}
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
	if got := NodeState(99).String(); got != tetherv1.NodeState(99).String() {
		t.Errorf("an unknown state reads %q, tether.v1 reads %q", got, tetherv1.NodeState(99).String())
	}
	if got := StateName(NodeStateExited); got != "exited" {
		t.Errorf("StateName(NodeStateExited) = %q, want exited", got)
	}
}

func TestSignalKindIsTetherV1s(t *testing.T) {
	if len(signalKindNames) != len(tetherv1.SignalKind_name) {
		t.Fatalf("%d signal kinds, tether.v1 has %d", len(signalKindNames), len(tetherv1.SignalKind_name))
	}
	for v, name := range tetherv1.SignalKind_name {
		if got := SignalKind(v).String(); got != name {
			t.Errorf("SignalKind(%d).String() = %q, want %q", v, got, name)
		}
	}
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
