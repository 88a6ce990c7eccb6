package ledger

import (
	"errors"
	"strings"
	"testing"
	"time"

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

// A report of a call already ended: the gate that ended it may repeat
// itself; a termination's closing (cancel_unacknowledged) is final, and a
// late end or acknowledgement is refused with what the record says.
func TestAReportAfterATerminationClosedTheCallIsRefused(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		endedBy string
		res     CallResolution
		by      string
		refused bool
	}{
		{"the gate's own retry", "tool:gate-1", CallResolutionCompleted, "tool:gate-1", false},
		{"the gate's retried ack", "tool:gate-1", CallResolutionCancelledAcked, "tool:gate-1", false},
		{"a call stored before provenance", "", CallResolutionCompleted, "tool:gate-1", false},
		{"a late ack after the termination closed it", "termination:t_1", CallResolutionCancelUnacknowledged, "tool:gate-1", true},
	} {
		c := &ToolCall{CallID: "c_1", State: CallStateEnded, Resolution: tc.res, EndedBy: tc.endedBy, EndedAt: at}
		err := reportOnEnded(c, tc.by)
		if (err != nil) != tc.refused {
			t.Errorf("%s: %v, refused want %v", tc.name, err, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrCallClosed) {
			t.Errorf("%s: %v is not ErrCallClosed", tc.name, err)
		}
		for _, word := range []string{"c_1", "cancel_unacknowledged", "termination:t_1", "2026-11-30T12:00:00Z", "not recorded"} {
			if !strings.Contains(err.Error(), word) {
				t.Errorf("%s: %q does not say %q", tc.name, err, word)
			}
		}
	}
}
