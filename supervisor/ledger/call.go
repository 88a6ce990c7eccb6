package ledger

import (
	"fmt"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// ToolCall is one call in the ledger. Its stored form is the protobuf
// encoding of tether.v1.ToolCall (the pb tags are that message's field
// numbers), so a call written by any version reads back.
type ToolCall struct {
	CallID  string `pb:"1"`
	NodeID  string `pb:"2"`
	GrantID string `pb:"3"`
	Tool    string `pb:"4"`
	// The gate that reported the call (provenance).
	GateID            string         `pb:"5"`
	State             CallState      `pb:"6"`
	Resolution        CallResolution `pb:"7"`
	BegunAt           time.Time      `pb:"8"`
	EndedAt           time.Time      `pb:"9"`
	CancelRequestedAt time.Time      `pb:"10"`
	CancelAckedAt     time.Time      `pb:"11"`
	TerminationID     string         `pb:"12"`
	Error             string         `pb:"13"`
	// Who reported each step (principal ids, e.g. "tool:shell-gate"): the
	// tool server that began the call, the one that ended it (or
	// "termination:<id>" when a termination closed it unacknowledged), and
	// the one that acknowledged its cancellation.
	BegunBy        string `pb:"14"`
	EndedBy        string `pb:"15"`
	AcknowledgedBy string `pb:"16"`
}

// CallState is where a call is; the values are tether.v1's.
type CallState int32

// Call states.
const (
	CallStateUnspecified     CallState = 0
	CallStateInFlight        CallState = 1
	CallStateCancelRequested CallState = 2
	CallStateEnded           CallState = 3
)

var callStateNames = [...]string{
	CallStateUnspecified:     "CALL_STATE_UNSPECIFIED",
	CallStateInFlight:        "CALL_STATE_IN_FLIGHT",
	CallStateCancelRequested: "CALL_STATE_CANCEL_REQUESTED",
	CallStateEnded:           "CALL_STATE_ENDED",
}

// String is the state's tether.v1 name ("CALL_STATE_IN_FLIGHT"), or its
// number when it has none.
func (s CallState) String() string { return enumname.Of(callStateNames[:], s, "") }

// CallResolution is how a call ended; the values are tether.v1's.
type CallResolution int32

// Call resolutions.
const (
	CallResolutionUnspecified          CallResolution = 0
	CallResolutionCompleted            CallResolution = 1
	CallResolutionCancelledAcked       CallResolution = 2
	CallResolutionCancelUnacknowledged CallResolution = 3
	CallResolutionRejectedDraining     CallResolution = 4
	CallResolutionFailed               CallResolution = 5
)

var callResolutionNames = [...]string{
	CallResolutionUnspecified:          "CALL_RESOLUTION_UNSPECIFIED",
	CallResolutionCompleted:            "CALL_RESOLUTION_COMPLETED",
	CallResolutionCancelledAcked:       "CALL_RESOLUTION_CANCELLED_ACKED",
	CallResolutionCancelUnacknowledged: "CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED",
	CallResolutionRejectedDraining:     "CALL_RESOLUTION_REJECTED_DRAINING",
	CallResolutionFailed:               "CALL_RESOLUTION_FAILED",
}

// String is the resolution's tether.v1 name ("CALL_RESOLUTION_FAILED"), or
// its number when it has none.
func (r CallResolution) String() string { return enumname.Of(callResolutionNames[:], r, "") }

// reportOnEnded answers a gate's report (an end or a cancel
// acknowledgement) of a call that has already ended. The gate's own retry
// is idempotent (nil: the call is answered as it stands). A call a
// termination closed — it stopped waiting for the gate and wrote the call
// cancel_unacknowledged into its record — refuses the report: answering it
// would tell the gate its word was recorded when the record says otherwise.
// A call stored before calls named who ended them keeps the old answer.
func reportOnEnded(c *ToolCall, by string) error {
	if c.EndedBy == by || c.EndedBy == "" {
		return nil
	}
	return fmt.Errorf("%w: call_id %s was closed %s by %s at %s, when the termination stopped waiting for the gate; a report after that is not recorded",
		ErrCallClosed, c.CallID, resolutionWord(c.Resolution), c.EndedBy, c.EndedAt.UTC().Format(time.RFC3339))
}

// resolutionWord is a resolution as the record's readers know it
// ("cancel_unacknowledged").
func resolutionWord(r CallResolution) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "CALL_RESOLUTION_"))
}
