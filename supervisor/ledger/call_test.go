package ledger

import (
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The call states and resolutions carry tether.v1's numbers (the RPC edge
// converts them with a cast, and the stored calls hold them), and String
// returns tether.v1's names, which the stop rules' counters and the
// console show: every value of the generated enums is pinned.
func TestCallStateIsTetherV1s(t *testing.T) {
	if len(callStateNames) != len(tetherv1.CallState_name) {
		t.Fatalf("%d call states, tether.v1 has %d", len(callStateNames), len(tetherv1.CallState_name))
	}
	for v, name := range tetherv1.CallState_name {
		if got := CallState(v).String(); got != name {
			t.Errorf("CallState(%d).String() = %q, want %q", v, got, name)
		}
	}
	for s, want := range map[CallState]tetherv1.CallState{
		CallStateUnspecified:     tetherv1.CallState_CALL_STATE_UNSPECIFIED,
		CallStateInFlight:        tetherv1.CallState_CALL_STATE_IN_FLIGHT,
		CallStateCancelRequested: tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED,
		CallStateEnded:           tetherv1.CallState_CALL_STATE_ENDED,
	} {
		if int32(s) != int32(want) {
			t.Errorf("%v = %d, tether.v1 says %d", s, s, want)
		}
	}
	if got := CallState(99).String(); got != tetherv1.CallState(99).String() {
		t.Errorf("an unknown state reads %q, tether.v1 reads %q", got, tetherv1.CallState(99).String())
	}
}

func TestCallResolutionIsTetherV1s(t *testing.T) {
	if len(callResolutionNames) != len(tetherv1.CallResolution_name) {
		t.Fatalf("%d resolutions, tether.v1 has %d", len(callResolutionNames), len(tetherv1.CallResolution_name))
	}
	for v, name := range tetherv1.CallResolution_name {
		if got := CallResolution(v).String(); got != name {
			t.Errorf("CallResolution(%d).String() = %q, want %q", v, got, name)
		}
	}
	for r, want := range map[CallResolution]tetherv1.CallResolution{
		CallResolutionUnspecified:          tetherv1.CallResolution_CALL_RESOLUTION_UNSPECIFIED,
		CallResolutionCompleted:            tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED,
		CallResolutionCancelledAcked:       tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		CallResolutionCancelUnacknowledged: tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
		CallResolutionRejectedDraining:     tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING,
		CallResolutionFailed:               tetherv1.CallResolution_CALL_RESOLUTION_FAILED,
	} {
		if int32(r) != int32(want) {
			t.Errorf("%v = %d, tether.v1 says %d", r, r, want)
		}
	}
}
