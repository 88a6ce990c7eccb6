package lease_test

import (
	"encoding/csv"
	"strings"
	"testing"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestSeedRecordDefusesFormulas: the values an agent chooses (the job id it
// offered, a holder's identity, a reason) reach a CSV file an operator opens
// in a spreadsheet; none may start as a live formula, in the console's
// export or the CLI's.
func TestSeedRecordDefusesFormulas(t *testing.T) {
	for _, hostile := range []string{`=HYPERLINK("http://evil")`, "+1", "-2", "@SUM(A1)", "\tx", "\r=x"} {
		row := lease.EvidenceRow{JobID: hostile, LeaseID: "l_1", Generation: 1, HolderIdentity: hostile, Reason: hostile}
		got := row.SeedRecord()
		if len(got) != len(lease.SeedHeader()) {
			t.Fatalf("SeedRecord has %d cells, SeedHeader %d", len(got), len(lease.SeedHeader()))
		}
		for i, cell := range got {
			if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
				t.Errorf("%s: cell %q starts as a formula", lease.SeedHeader()[i], cell)
			}
		}
		if got[0] != "'"+hostile || got[3] != "'"+hostile {
			t.Errorf("job and holder cells = %q, %q; want the value behind an apostrophe", got[0], got[3])
		}
	}
	plain := lease.EvidenceRow{JobID: "job-1", LeaseID: "l_1", Generation: 1, HolderIdentity: "n_1"}.SeedRecord()
	if plain[0] != "job-1" || plain[3] != "n_1" {
		t.Errorf("a plain row changed: %q", plain)
	}
}

// TestWriteEvidenceCSVDefusesFormulas: the full matrix's CSV (every column,
// the message kind and decision time too) carries the same values an agent
// chose — its progress value above all, any text up to 4 KiB — and is as
// likely to be opened in a spreadsheet as the seed's columns. A holder's
// progress "=HYPERLINK(…,"SUCCESS")" must not run there, showing a result
// the job never had (sixteenth hostile pass).
func TestWriteEvidenceCSVDefusesFormulas(t *testing.T) {
	hostile := `=HYPERLINK("http://evil","SUCCESS")`
	row := lease.EvidenceRow{JobID: "-1", LeaseID: "@l", Generation: 1, HolderIdentity: "+n", ProgressSequence: 2, ProgressValue: hostile, Reason: "\t" + hostile}
	var buf strings.Builder
	if err := lease.WriteEvidenceCSV(&buf, []lease.EvidenceRow{row}); err != nil {
		t.Fatal(err)
	}
	records, err := csv.NewReader(strings.NewReader(buf.String())).ReadAll()
	if err != nil || len(records) != 2 {
		t.Fatalf("csv: %q, %v", records, err)
	}
	for i, cell := range records[1] {
		if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
			t.Errorf("%s: cell %q starts as a formula", lease.EvidenceHeader()[i], cell)
		}
	}
	if got := records[1][12]; got != "'"+hostile {
		t.Errorf("progress value cell = %q, want the value behind an apostrophe", got)
	}
}
