package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The record page says on whose word each job lease ended: worker-1
// reports SUCCESS for a job (its id the agent's own markup) while it is
// being aborted — listed as its claim under stop, escaped — and job-1,
// which it never finished, as ended by the termination.
func TestRecordPageSaysOnWhoseWordEachLeaseEnded(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	worker := w.srv.Clients(w.creds["worker-1"]).Lease
	const rogueJob = `<i>done</i>`
	offer, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: rogueJob, HolderIdentity: w.nodes["worker-1"].NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := offer.Msg.Lease
	if _, err := worker.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: rogueJob, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	term, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.nodes["worker-1"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	if _, err := worker.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: rogueJob, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS})); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Hour) // the rogue's gate never acknowledges the cancel
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(time.Hour)
	done := w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	rec := b.get("/ui/records/" + done.RecordId)
	if rec.status != http.StatusOK {
		t.Fatalf("record page: %d\n%s", rec.status, rec.body)
	}
	if strings.Contains(rec.body, rogueJob) {
		t.Fatal("the agent's job id reached the page unescaped")
	}
	table := regexp.MustCompile(`(?s)<table class="list" id="record-leases">.*?</table>`).FindString(rec.body)
	row := func(job string) string {
		return regexp.MustCompile(`(?s)<tr><td><a href="/ui/jobs/[^"]*/evidence">` + regexp.QuoteMeta(job) + `</a>.*?</tr>`).FindString(table)
	}
	rogue, left := row("&lt;i&gt;done&lt;/i&gt;"), row("job-1")
	for _, want := range []string{"success", `class="warn"`, "the holder&#39;s report", "<code>" + w.nodes["worker-1"].NodeId + "</code>", "its claim, not confirmed"} {
		if !strings.Contains(rogue, want) {
			t.Errorf("the rogue's row lacks %s:\n%s", want, rogue)
		}
	}
	for _, want := range []string{"the termination"} {
		if !strings.Contains(left, want) {
			t.Errorf("job-1's row lacks %s:\n%s", want, left)
		}
	}
	if strings.Contains(left, "not confirmed") || strings.Contains(left, "holder&#39;s report") {
		t.Errorf("job-1, ended by the termination, reads as the holder's word:\n%s", left)
	}
}
