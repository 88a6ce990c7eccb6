package ledger

import (
	"testing"

	"github.com/tetherhq/tether/internal/enumname/enumtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The call states and resolutions carry tether.v1's numbers (the RPC edge
// converts them with a cast, and the stored calls hold them), and String
// returns tether.v1's names, which the stop rules' counters and the
// console show: every value of the generated enums is pinned.
func TestCallStateIsTetherV1s(t *testing.T) {
	enumtest.Pin(t, "CallState", tetherv1.CallState_name, len(callStateNames), func(v int32) string { return CallState(v).String() })
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
}

func TestCallResolutionIsTetherV1s(t *testing.T) {
	enumtest.Pin(t, "CallResolution", tetherv1.CallResolution_name, len(callResolutionNames), func(v int32) string { return CallResolution(v).String() })
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
