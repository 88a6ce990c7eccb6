package lease_test

import (
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
