package console_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// evidencePad is more rows than one page of the server's Evidence answer
// (1000): the console must read past it.
const evidencePad = 1200

var evidenceRowNumber = regexp.MustCompile(`<tr class="d-[a-z]+(?: flagged)?"><td>(\d+)</td>`)

// TestARogueCannotPadItsJobsEvidencePastWhatTheConsoleShows: worker-1,
// the holder of job-1, sends a thousand and more harmless progress reports
// (each one accepted, each a row of the job's evidence matrix) and only
// then does what a reviewer looks for: an acknowledgement of a generation
// it was never given, a rejected row. The server answers Evidence a thousand
// rows at a time; a console that read only the first answer showed
// "1000 of 1000 rows", its "rejected" filter found only the row of before
// the padding, and its CSV download — "the evidence matrix" — ended at row
// 1000. The console reads every page: the count is the job's, the filter
// finds the late row, the CSV holds every row, and the unfiltered page shows the first thousand
// and links to the rest. (Fails if the console reads only the first page.)
func TestARogueCannotPadItsJobsEvidencePastWhatTheConsoleShows(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	padEvidence(t, w, evidencePad)
	// The job's rows as the server holds them, every page.
	total, last := 0, uint64(0)
	token := ""
	for {
		resp, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job-1", PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Rows {
			total++
			last = r.Row
		}
		if token = resp.Msg.NextPageToken; token == "" {
			break
		}
	}
	if total <= 1000 {
		t.Fatalf("the job has %d rows; the probe needs more than one page", total)
	}

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))

	rejected := b.get("/ui/jobs/job-1/evidence?outcome=rejected")
	if rejected.status != http.StatusOK {
		t.Fatalf("evidence page: %d\n%s", rejected.status, rejected.body)
	}
	var shown []string
	for _, m := range evidenceRowNumber.FindAllStringSubmatch(rejected.body, -1) {
		shown = append(shown, m[1])
	}
	if len(shown) != 2 || shown[1] != strconv.FormatUint(last, 10) {
		t.Errorf("the rejected rows shown are %v; want the rejected one before the padding and the last, row %d", shown, last)
	}
	if want := "2 of " + strconv.Itoa(total) + " rows"; !strings.Contains(rejected.body, want) {
		t.Errorf("the page does not say %q:\n%s", want, summaryOf(rejected.body))
	}

	// Unfiltered, the page shows a thousand rows and links to the rest.
	seen := 0
	next := "/ui/jobs/job-1/evidence"
	for pages := 0; next != ""; pages++ {
		if pages > 2 {
			t.Fatal("the evidence pages do not end")
		}
		p := b.get(next)
		rowsShown := evidenceRowNumber.FindAllStringSubmatch(p.body, -1)
		seen += len(rowsShown)
		next = ""
		if m := evidenceNext.FindStringSubmatch(p.body); m != nil {
			next = html.UnescapeString(m[1])
		} else if len(rowsShown) == 0 || rowsShown[len(rowsShown)-1][1] != strconv.FormatUint(last, 10) {
			t.Errorf("the last evidence page ends before row %d", last)
		}
	}
	if seen != total {
		t.Errorf("the evidence pages showed %d rows; the job has %d", seen, total)
	}

	all := b.get("/ui/jobs/job-1/evidence/csv")
	rows, err := csv.NewReader(strings.NewReader(all.body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows)-1 != total {
		t.Errorf("the CSV holds %d rows; the job has %d", len(rows)-1, total)
	}
	if !strings.HasPrefix(rows[len(rows)-1][16], "REJECTED") {
		t.Errorf("the CSV's last row is not the rejected acknowledgement: %q", rows[len(rows)-1])
	}
}

var evidenceNext = regexp.MustCompile(`<a href="([^"]+)" id="evidence-next">`)

var evidenceSummary = regexp.MustCompile(`<p class="summary" id="evidence-count">[^<]*</p>`)

func summaryOf(body string) string { return evidenceSummary.FindString(body) }

// TestARogueCannotHideALeaseFromItsNodePage: the node page lists the
// node's leases and grants from one answer each, and the server answers a
// thousand at a time, in job id order. worker-1 holds job-1; its parent,
// the planner, offers it a thousand jobs whose ids sort first ("0-000" …),
// and worker-1's node page — what an operator reads before stopping it —
// listed "Job leases (1000)", all of them padding, job-1 nowhere and
// nothing saying more were held. The page now says the list goes on and links to the rest
// (the leases page, by holder, which pages), and that page shows job-1.
// (Fails if the node page shows the first answer as the whole list.)
func TestARogueCannotHideALeaseFromItsNodePage(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	planner := w.srv.Clients(w.creds["planner"])
	id := w.nodes["worker-1"].NodeId
	for i := range 1000 {
		if _, err := planner.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: fmt.Sprintf("0-%03d", i), HolderIdentity: id, LeaseDuration: durationpb.New(time.Minute)})); err != nil {
			t.Fatalf("offer %d: %v", i, err)
		}
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get("/ui/nodes/" + id)
	if p.status != http.StatusOK {
		t.Fatalf("node page: %d\n%s", p.status, p.body)
	}
	if strings.Contains(p.body, "<td>job-1</td>") {
		return // every lease listed
	}
	m := leasesMore.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("the node page lists %d leases, not job-1, and says nothing of more", strings.Count(p.body, `evidence">evidence</a>`))
	}
	seen := false
	for next, pages := html.UnescapeString(m[1]), 0; next != "" && !seen; pages++ {
		if pages > 3 {
			t.Fatal("the leases pages do not end")
		}
		l := b.get(next)
		seen = strings.Contains(l.body, "<td>job-1</td>")
		next = ""
		if m := leasesNext.FindStringSubmatch(l.body); m != nil {
			next = html.UnescapeString(m[1])
		}
	}
	if !seen {
		t.Fatal("the leases the node page links to do not include job-1")
	}
}

var (
	leasesMore = regexp.MustCompile(`<a href="([^"]+)" id="leases-more">`)
	leasesNext = regexp.MustCompile(`<a href="(/ui/leases\?[^"]+)">more →</a>`)
)

// padEvidence has worker-1, job-1's holder, send n accepted progress
// reports (a row each in the job's evidence) and then one acknowledgement
// of a generation it was never given (a rejected row after the padding).
func padEvidence(t *testing.T, w *world, n int) {
	t.Helper()
	ctx := context.Background()
	worker := w.srv.Clients(w.creds["worker-1"]).Lease
	got, err := worker.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-1"}))
	if err != nil {
		t.Fatal(err)
	}
	l := got.Msg.Lease
	for i := 0; i < n; i++ {
		if _, err := worker.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: uint64(2 + i), ProgressValue: strconv.Itoa(i)})); err != nil {
			t.Fatalf("progress %d: %v", i, err)
		}
	}
	if _, err := worker.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration + 7})); err != nil {
		t.Fatal(err)
	}
}
