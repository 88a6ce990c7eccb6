package lease_test

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// The seed's evidence matrix, column for column, in its order; paired
// columns ("ACK Deadline/State") are split in two. Then the message kind
// and the decision time.
func TestEvidenceHeaderIsTheSeedMatrix(t *testing.T) {
	want := []string{
		"Job ID", "Lease ID", "Generation", "Holder Identity", "Issued At", "Lease Duration", "Expires At",
		"ACK Deadline", "ACK State", "Renew Sequence", "Renew Time", "Progress Sequence", "Progress Value",
		"Cancel Requested", "Cancel ACK", "Terminal Result", "Stale Generation", "Late Progress",
		"Lease Expired", "Ownership Conflict", "Decision", "Reason", "Message", "Decided At",
	}
	if got := lease.EvidenceHeader(); !slices.Equal(got, want) {
		t.Fatalf("header:\n got  %q\n want %q", got, want)
	}
}

func TestEvidenceRowRecordsPostDecisionState(t *testing.T) {
	p := lease.DefaultPolicy()
	l := activeLease(t, p)
	l, _, _ = lease.Step(l, lease.Renew{Claim: claimW1(), RenewSequence: 1}, at(10), p)
	l, _, _ = lease.Step(l, lease.Progress{Claim: claimW1(), ProgressSequence: 3, ProgressValue: `30%, "almost"`}, at(11), p)
	stale := lease.Progress{Claim: claimW1(), ProgressSequence: 2, ProgressValue: "20%"}
	l, d, _ := lease.Step(l, stale, at(12), p)

	row := lease.NewEvidenceRow(l, stale, d, at(12))
	got := map[string]string{}
	for i, col := range lease.EvidenceHeader() {
		got[col] = row.Record()[i]
	}
	want := map[string]string{
		"Job ID": "j1", "Lease ID": "L1", "Generation": "1", "Holder Identity": "w1",
		"Issued At": "2030-01-01T00:00:00Z", "Lease Duration": "30s", "Expires At": "2030-01-01T00:00:40Z",
		"ACK Deadline": "2030-01-01T00:00:10Z", "ACK State": "ACKED",
		"Renew Sequence": "1", "Renew Time": "2030-01-01T00:00:10Z",
		"Progress Sequence": "3", "Progress Value": `30%, "almost"`,
		"Cancel Requested": "false", "Cancel ACK": "false", "Terminal Result": "",
		"Stale Generation": "false", "Late Progress": "true", "Lease Expired": "false", "Ownership Conflict": "false",
		"Decision": "REJECTED LATE_PROGRESS", "Reason": d.Reason, "Message": "progress", "Decided At": "2030-01-01T00:00:12Z",
	}
	for col, w := range want {
		if got[col] != w {
			t.Errorf("%s = %q, want %q", col, got[col], w)
		}
	}
	if !strings.Contains(d.Reason, "seq 2") || !strings.Contains(d.Reason, `"20%"`) {
		t.Errorf("reason %q does not name the late message", d.Reason)
	}

	// CSV survives commas and quotes in values.
	var buf bytes.Buffer
	if err := lease.WriteEvidenceCSV(&buf, []lease.EvidenceRow{row, row}); err != nil {
		t.Fatal(err)
	}
	records, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != 3 || !slices.Equal(records[0], lease.EvidenceHeader()) || !slices.Equal(records[1], row.Record()) {
		t.Fatalf("csv round trip: %q", records)
	}
}

func TestEvidenceRowForUnknownJob(t *testing.T) {
	m := lease.Renew{Claim: lease.Claim{JobID: "ghost", LeaseID: "L1", Generation: 1, HolderIdentity: "w1"}, RenewSequence: 1}
	l, d, _ := lease.Step(lease.Lease{}, m, at(0), lease.DefaultPolicy())
	row := lease.NewEvidenceRow(l, m, d, at(0))
	if row.JobID != "ghost" || row.Decision.Event != lease.EventUnknownLease || row.Message != lease.KindRenew {
		t.Fatalf("row %+v", row)
	}
	record := row.Record()
	if record[0] != "ghost" || record[4] != "" || record[8] != "" {
		t.Fatalf("record %q: unset fields must render empty", record)
	}
}

func TestEveryDecisionYieldsARow(t *testing.T) {
	// One message of every kind, each rejected, duplicated or accepted, each
	// producing a complete row with a reason.
	p := lease.DefaultPolicy()
	l := lease.Lease{}
	msgs := []lease.Message{
		lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 30 * time.Second},
		lease.Ack{Claim: claimW1()},
		lease.Renew{Claim: claimW1(), RenewSequence: 1},
		lease.Progress{Claim: claimW1(), ProgressSequence: 1, ProgressValue: "x"},
		lease.RequestCancel{JobID: "j1"},
		lease.CancelAck{Claim: claimW1()},
		lease.Reassign{JobID: "j1", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: 30 * time.Second},
		lease.Complete{Claim: claimW1(), Result: lease.ResultCancelled},
		lease.Resolve{JobID: "j1", Result: lease.ResultCancelled},
		lease.Tick{JobID: "j1"},
		lease.Recover{JobID: "j1", LastAlive: at(0), ExtendTo: at(20)},
	}
	kinds := map[lease.Kind]bool{}
	for i, m := range msgs {
		now := at(i)
		post, d, _ := lease.Step(l, m, now, p)
		row := lease.NewEvidenceRow(post, m, d, now)
		record := row.Record()
		if len(record) != len(lease.EvidenceHeader()) || record[21] == "" || record[20] == "" {
			t.Fatalf("%s: record %q", m.Kind(), record)
		}
		kinds[row.Message] = true
		l = post
	}
	if len(kinds) != len(msgs) {
		t.Fatalf("rows name %d message kinds, want %d", len(kinds), len(msgs))
	}
}
