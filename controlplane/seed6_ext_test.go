package controlplane_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// PROMISES

// Seed 000 §5 and §14 (2), against a hostile sibling: an ACK is the
// holder's acceptance before the coordinator's deadline, and only the
// coordinator's policy decides what a missed one means. A rogue that
// spends the rate budget its lineage shares must not be able to make its
// sibling miss the ACK of a job offered to it — the generation would
// expire for a missed ACK the holder sent in time, and the job would be
// reassigned or left EXPIRED: a job frozen by a member of the lineage that
// is not party to it. The sibling's unary ACK (the TypeScript SDK's, and
// any plain client's) goes through on its node's own reserve, as its
// renewals, cancel acknowledgements and completions do; the rogue, its
// budget spent, gets nothing more for anything else.
func TestSeed6ARogueSpendingTheLineagesBudgetCannotMakeItsSiblingMissAnAck(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 16 })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "planner")
	rootC := srv.Clients(root.Credential)
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	honestC, rogueC := srv.Clients(honest.Credential), srv.Clients(rogue.Credential)

	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: honest.Node.NodeId,
		LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	spendLineage(t, rogueC, rogue.Node.NodeId)
	if _, err := rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.Node.NodeId})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's next call: %v, want resource_exhausted (its reserve is for upkeep only)", err)
	}
	l, d, errText := unary{honestC}.try(t, ack(offered.Msg.Lease))
	if errText != "" {
		t.Fatalf("the sibling's ACK, well before its deadline, once the rogue spent the lineage's budget: %s", errText)
	}
	wantDecision(t, "the sibling's ACK", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	if l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
		t.Fatalf("after the ACK: %v", l)
	}
	// The rogue's own reserve buys it no ACK of a job that is not its own:
	// a stranger to the job is refused, whatever budget it draws on.
	if _, _, errText := (unary{rogueC}).try(t, ack(offered.Msg.Lease)); !strings.HasPrefix(errText, "permission_denied: ") && !strings.HasPrefix(errText, "resource_exhausted: ") {
		t.Fatalf("the rogue acking its sibling's job: %q", errText)
	}
	if got := (&leaseWorld{admin: admin}).get(t, "job-1"); got.HolderIdentity != honest.Node.NodeId || got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.OwnershipConflict {
		t.Fatalf("after the rogue's ACK: %v", got)
	}
}

// Seed 000 §6, §8 and §11, the sequences at the edges of their range. A
// sequence may skip ahead (it need only advance), but it never wraps: a
// holder that has used the highest renew or progress sequence gets no
// more renewals under this generation — a renew that starts again at 1 is
// STALE_RENEW and extends nothing, progress that starts again at 1 is
// LATE_PROGRESS and the record keeps the highest. The highest replayed is
// a DUPLICATE. A sequence outside the range (negative, or past 2^64-1) is
// not a sequence: the JSON request is refused InvalidArgument, never
// judged, with no row.
func TestSeed6SequencesSkipButNeverWrap(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))

		w.clock.Advance(time.Second)
		l, d := w1.send(t, renew(l, 5))
		wantDecision(t, "renew 5 first (a skip)", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		w.clock.Advance(time.Second)
		l, d = w1.send(t, renew(l, math.MaxUint64))
		wantDecision(t, "renew at the highest sequence", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		expiry := l.ExpiresAt.AsTime()
		w.clock.Advance(time.Second)
		for _, tc := range []struct {
			what  string
			seq   uint64
			event tetherv1.AuditEvent
			out   tetherv1.Outcome
		}{
			{"renew wrapped to 1", 1, tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW, tetherv1.Outcome_OUTCOME_REJECTED},
			{"renew at the highest replayed", math.MaxUint64, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW, tetherv1.Outcome_OUTCOME_DUPLICATE},
			{"renew just below the highest", math.MaxUint64 - 1, tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW, tetherv1.Outcome_OUTCOME_REJECTED},
		} {
			got, d := w1.send(t, renew(l, tc.seq))
			wantDecision(t, tc.what, d, tc.out, tc.event)
			if !got.ExpiresAt.AsTime().Equal(expiry) || got.RenewSequence != math.MaxUint64 {
				t.Fatalf("%s moved the lease: %v (expiry was %s)", tc.what, got, expiry)
			}
		}

		_, d = w1.send(t, progress(l, 7, "seven"))
		wantDecision(t, "progress 7 first (a skip)", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		_, d = w1.send(t, progress(l, math.MaxUint64, "last"))
		wantDecision(t, "progress at the highest sequence", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		got, d := w1.send(t, progress(l, 1, "wrapped"))
		wantDecision(t, "progress wrapped to 1", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		if got.ProgressSequence != math.MaxUint64 || got.ProgressValue != "last" || !got.LateProgress {
			t.Fatalf("after progress wrapped to 1: %v", got)
		}
		_, d = w1.send(t, progress(l, math.MaxUint64, "last"))
		wantDecision(t, "progress at the highest replayed", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS)
	})

	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "w1")
	w := &leaseWorld{srv: srv, clock: clk, admin: admin}
	job := w.job()
	l, _ := unary{srv.Clients(worker.Credential)}.send(t, ack(w.offer(t, job, worker.Node.NodeId, time.Minute)))
	rows := len(w.evidence(t, job))
	before := w.get(t, job)
	for _, seq := range []string{`-1`, `"-1"`, `"18446744073709551616"`, `1.5`} {
		body := `{"jobId":"` + job + `","leaseId":"` + l.LeaseId + `","leaseGeneration":"1","renewSequence":` + seq + `}`
		status, answer := postJSON(t, srv, worker.Credential, "/tether.v1.LeaseService/Renew", body)
		if status != http.StatusBadRequest || !strings.Contains(answer, `"code":"invalid_argument"`) {
			t.Fatalf("renew_sequence %s: HTTP %d %s, want 400 invalid_argument", seq, status, answer)
		}
	}
	if got := w.get(t, job); got.RenewSequence != before.RenewSequence || !got.ExpiresAt.AsTime().Equal(before.ExpiresAt.AsTime()) {
		t.Fatalf("a malformed sequence moved the lease: %v", got)
	}
	if got := len(w.evidence(t, job)); got != rows {
		t.Fatalf("%d evidence rows after malformed sequences, want %d (none judged)", got, rows)
	}
}

// postJSON sends a Connect unary request as JSON with token and returns the
// HTTP status and body.
func postJSON(t *testing.T, srv *testserver.Server, token, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := srv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer strings.Builder
	_, _ = io.Copy(&answer, resp.Body)
	return resp.StatusCode, answer.String()
}
