package console_test

import (
	"html"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue41kReads is the most rows one evidence page may read (four of the
// server's Evidence answers); rogue41kPad is more progress reports than
// that, small enough for -race on a loaded machine.
const (
	rogue41kReads = 4000
	rogue41kPad   = 4300
)

var evidenceRead = regexp.MustCompile(`id="evidence-count">\d+ of (?:the )?(\d+) rows`)

// TestRogue41KAnEvidencePageReadsAPageOfARoguesRows: worker-1, the holder of
// job-1's live generation, sends progress report after progress report
// (each accepted, each a row kept for ever: a live generation's rows are
// never folded) and then an acknowledgement of a generation it was never
// given. The evidence page an operator opens with the "rejected" filter
// read every row of the matrix to count it, a read per thousand of the
// rogue's messages (4,305 rows for this page; a rogue's hundred thousand
// made the page fail at its deadline, drawing nothing). It now reads at
// most four answers (4,000 rows) a page, says it read that many and that
// more follow, and its "next" link reads on from where it stopped, to the
// rejected row after the padding.
func TestRogue41KAnEvidencePageReadsAPageOfARoguesRows(t *testing.T) {
	w := newWorld(t)
	padEvidence(t, w, rogue41kPad)

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	var rejected []string
	next := "/ui/jobs/job-1/evidence?outcome=rejected"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("the evidence pages do not end")
		}
		p := b.get(next)
		if p.status != http.StatusOK {
			t.Fatalf("evidence page %s: %d\n%s", next, p.status, p.body)
		}
		m := evidenceRead.FindStringSubmatch(p.body)
		if m == nil {
			t.Fatalf("the evidence page does not say how many rows it read: %s", summaryOf(p.body))
		}
		if n, _ := strconv.Atoi(m[1]); n > rogue41kReads {
			t.Errorf("the evidence page %s read %d rows of the rogue's; want at most %d (%s)", next, n, rogue41kReads, summaryOf(p.body))
		}
		for _, r := range evidenceRowNumber.FindAllStringSubmatch(p.body, -1) {
			rejected = append(rejected, r[1])
		}
		next = ""
		if m := evidenceNext.FindStringSubmatch(p.body); m != nil {
			next = html.UnescapeString(m[1])
		}
	}
	if len(rejected) != 2 {
		t.Errorf("the evidence pages showed rejected rows %v; want the one before the padding and the one after it", rejected)
	}
}
