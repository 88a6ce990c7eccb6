package lease

import (
	"encoding/csv"
	"io"
	"strconv"
	"strings"
	"time"
)

// EvidenceRow is one row of the evidence matrix: the lease as it stands
// after a decision, the decision, and the message that caused it. There is
// one row per message, rejected ones included, so a reviewer can rebuild
// every transition from the rows alone. Fields mirror tether.v1.EvidenceRow
// (the store assigns the row number).
type EvidenceRow struct {
	JobID            string
	LeaseID          string
	Generation       uint64
	HolderIdentity   string
	IssuedAt         time.Time
	LeaseDuration    time.Duration
	ExpiresAt        time.Time
	AckDeadline      time.Time
	AckState         AckState
	RenewSequence    uint64
	RenewTime        time.Time
	ProgressSequence uint64
	ProgressValue    string
	CancelRequested  bool
	CancelAck        bool
	TerminalResult   TerminalResult

	StaleGeneration   bool
	LateProgress      bool
	LeaseExpired      bool
	OwnershipConflict bool

	Decision Decision
	Reason   string
	// Message is the kind of message judged; DecidedAt the coordinator
	// time it was judged at.
	Message   Kind
	DecidedAt time.Time
}

// NewEvidenceRow builds the row for one Step: after is the lease Step
// returned, m the message, d the decision, decidedAt the now passed to
// Step. For a message about a job without a lease, the row carries the
// message's job id.
func NewEvidenceRow(after Lease, m Message, d Decision, decidedAt time.Time) EvidenceRow {
	jobID := after.JobID
	var kind Kind
	if m != nil {
		kind = m.Kind()
		if jobID == "" {
			jobID = m.Job()
		}
	}
	return EvidenceRow{
		JobID:             jobID,
		LeaseID:           after.LeaseID,
		Generation:        after.Generation,
		HolderIdentity:    after.HolderIdentity,
		IssuedAt:          after.IssuedAt,
		LeaseDuration:     after.LeaseDuration,
		ExpiresAt:         after.ExpiresAt,
		AckDeadline:       after.AckDeadline,
		AckState:          after.AckState,
		RenewSequence:     after.RenewSequence,
		RenewTime:         after.RenewTime,
		ProgressSequence:  after.ProgressSequence,
		ProgressValue:     after.ProgressValue,
		CancelRequested:   after.CancelRequested,
		CancelAck:         after.CancelAck,
		TerminalResult:    after.TerminalResult,
		StaleGeneration:   after.StaleGeneration,
		LateProgress:      after.LateProgress,
		LeaseExpired:      after.LeaseExpired,
		OwnershipConflict: after.OwnershipConflict,
		Decision:          d,
		Reason:            d.Reason,
		Message:           kind,
		DecidedAt:         decidedAt,
	}
}

// EvidenceHeader returns the evidence matrix's column names: the seed's
// columns in the seed's order (paired columns such as "ACK Deadline/State"
// split in two), then the message kind and the decision time.
func EvidenceHeader() []string {
	return []string{
		"Job ID", "Lease ID", "Generation", "Holder Identity", "Issued At",
		"Lease Duration", "Expires At", "ACK Deadline", "ACK State",
		"Renew Sequence", "Renew Time", "Progress Sequence", "Progress Value",
		"Cancel Requested", "Cancel ACK", "Terminal Result", "Stale Generation",
		"Late Progress", "Lease Expired", "Ownership Conflict", "Decision",
		"Reason", "Message", "Decided At",
	}
}

// Record renders the row in EvidenceHeader's column order. Times are
// RFC 3339 UTC, empty when unset; enums empty when unspecified; the
// Decision column is "OUTCOME EVENT", e.g. "REJECTED STALE_GENERATION".
func (r EvidenceRow) Record() []string {
	return []string{
		r.JobID,
		r.LeaseID,
		strconv.FormatUint(r.Generation, 10),
		r.HolderIdentity,
		csvTime(r.IssuedAt),
		csvDuration(r.LeaseDuration),
		csvTime(r.ExpiresAt),
		csvTime(r.AckDeadline),
		csvEnum(int32(r.AckState), r.AckState.String()),
		strconv.FormatUint(r.RenewSequence, 10),
		csvTime(r.RenewTime),
		strconv.FormatUint(r.ProgressSequence, 10),
		r.ProgressValue,
		strconv.FormatBool(r.CancelRequested),
		strconv.FormatBool(r.CancelAck),
		csvEnum(int32(r.TerminalResult), r.TerminalResult.String()),
		strconv.FormatBool(r.StaleGeneration),
		strconv.FormatBool(r.LateProgress),
		strconv.FormatBool(r.LeaseExpired),
		strconv.FormatBool(r.OwnershipConflict),
		r.Decision.Outcome.String() + " " + r.Decision.Event.String(),
		r.Reason,
		csvEnum(int32(r.Message), r.Message.String()),
		csvTime(r.DecidedAt),
	}
}

// WriteEvidenceCSV renders rows as CSV with the header first, for a file
// someone may open in a spreadsheet: as in SeedRecord, a cell that would
// start with a formula character is prefixed with an apostrophe, so a
// value an agent chose (a progress value, a job id, a reason) is shown as
// text and never run as a formula. Record has the values as they are.
func WriteEvidenceCSV(w io.Writer, rows []EvidenceRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(EvidenceHeader()); err != nil {
		return err
	}
	for _, r := range rows {
		if err := cw.Write(spreadsheetSafe(r.Record())); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func csvTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func csvDuration(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func csvEnum(v int32, name string) string {
	if v == 0 {
		return ""
	}
	return name
}

// SeedHeader returns the evidence matrix's 18 columns exactly as the
// job-lease protocol names them. Paired columns ("ACK Deadline/State") hold
// both values separated by " / " (SeedRecord).
func SeedHeader() []string {
	return []string{
		"Job ID", "Lease ID", "Generation", "Holder Identity", "Issued At", "Lease Duration", "Expires At",
		"ACK Deadline/State", "Renew Sequence/Time", "Progress Sequence/Value", "Cancel Requested/ACK",
		"Terminal Result", "Stale Generation", "Late Progress", "Lease Expired", "Ownership Conflict", "Decision", "Reason",
	}
}

// SeedRecord renders the row in SeedHeader's column order, for a CSV file
// someone may open in a spreadsheet: a cell that would start with a
// formula character (=, +, -, @, a tab or a carriage return) is prefixed
// with an apostrophe, so a value an agent chose (a job id, a holder's name,
// a reason) is shown as text and never run as a formula.
func (r EvidenceRow) SeedRecord() []string {
	f := r.Record()
	pair := func(a, b string) string { return a + " / " + b }
	return spreadsheetSafe([]string{
		f[0], f[1], f[2], f[3], f[4], f[5], f[6],
		pair(f[7], f[8]), pair(f[9], f[10]), pair(f[11], f[12]), pair(f[13], f[14]),
		f[15], f[16], f[17], f[18], f[19], f[20], f[21],
	})
}

// spreadsheetSafe prefixes with an apostrophe every cell a spreadsheet
// would read as a formula.
func spreadsheetSafe(cells []string) []string {
	for i, c := range cells {
		if c != "" && strings.ContainsRune("=+-@\t\r", rune(c[0])) {
			cells[i] = "'" + c
		}
	}
	return cells
}
