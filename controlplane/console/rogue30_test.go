package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"testing"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestTheEvidencePageShowsAFormerHoldersLateMessages: job-1 moves from
// worker-1 to worker-2, and worker-1 goes on renewing its old generation.
// Its first messages are rows of the job's evidence, the rest are only
// counted on the job's record: an operator reading the evidence page saw
// the rows and nothing of the messages past them, as if the former holder
// had gone quiet. The page now lists each former holder's kept and
// counted messages (the Evidence answer's stale_counts).
func TestTheEvidencePageShowsAFormerHoldersLateMessages(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	rogue := w.srv.Clients(w.creds["worker-1"]).Lease
	got, err := rogue.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-1"}))
	if err != nil {
		t.Fatal(err)
	}
	l := got.Msg.Lease
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	if p := b.get("/ui/jobs/job-1/evidence"); p.status != http.StatusOK || regexp.MustCompile(`id="evidence-stale"`).MatchString(p.body) {
		t.Fatalf("evidence page of a job without former holders: %d, lists late messages:\n%s", p.status, p.body)
	}
	if _, err := w.admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "job-1", HolderIdentity: w.nodes["worker-2"].NodeId, Reason: "moved"})); err != nil {
		t.Fatal(err)
	}
	const kept, folded = coordinator.StaleRowsPerFormerHolder, 5
	for seq := uint64(1000); seq < 1000+kept+folded; seq++ {
		if _, err := rogue.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq})); err != nil {
			t.Fatalf("stale renew %d: %v", seq, err)
		}
	}
	p := b.get("/ui/jobs/job-1/evidence")
	if p.status != http.StatusOK {
		t.Fatalf("evidence page: %d\n%s", p.status, p.body)
	}
	row := regexp.MustCompile(fmt.Sprintf(`<tr><td><a href="/ui/nodes/%s"><code>%s</code></a></td><td>%d</td><td>%d</td></tr>`,
		w.nodes["worker-1"].NodeId, w.nodes["worker-1"].NodeId, kept, folded))
	if !regexp.MustCompile(`id="evidence-stale"`).MatchString(p.body) || !row.MatchString(p.body) {
		t.Fatalf("the evidence page does not show worker-1's %d kept and %d counted late messages:\n%s", kept, folded, p.body)
	}
}
