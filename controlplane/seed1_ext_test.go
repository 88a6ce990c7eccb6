package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The third acceptance pass over the job-lease seed (000), clause by
// clause through the real server, for what a hostile holder or
// coordinator could still do that the earlier passes (seed_lease_ext_test.go,
// seed2_ext_test.go, lease_ext_test.go, lease_rogue_ext_test.go) leave
// out. Each runs on Badger, and on etcd with TETHER_TEST_STORE=etcd.

// Seed 000 §7, §9 and §12 at a restart: the restart policy's grace is for
// a holder the downtime kept from renewing, and a holder whose job was
// cancelled, or whose generation is under an ownership conflict, had no
// renewals to make — its authority was ending at the expiry it had. Four
// jobs of one holder: P (plain, ACTIVE), C (ACTIVE, cancel requested), K
// (ACTIVE, a conflict recorded by the planner's claim) and O (OFFERED,
// cancel requested). The coordinator stops; every deadline falls while it
// is down. Restarted, P gets its grace and renews; C, K and O keep the
// deadlines they had and expire, so the holder can no longer acknowledge
// the cancel, complete or renew, and the coordinator reconciles them. C's
// and K's leases used to come back ACTIVE with 30 s more authority: the
// cancellation and the conflict no longer bounded the authority the moment
// the coordinator restarted.
func TestSeed1ARestartGivesNoGraceToACancelledOrConflictedLease(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newLeaseWorldIn(t, dir, clk)
	ctx := context.Background()
	holder, planner := unary{w.w1C}, unary{w.plannerC}
	p, _ := holder.send(t, ack(w.offer(t, "P", w.w1, time.Minute)))
	c, _ := holder.send(t, ack(w.offer(t, "C", w.w1, time.Minute)))
	k, _ := holder.send(t, ack(w.offer(t, "K", w.w1, time.Minute)))
	resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "O", HolderIdentity: w.w1,
		LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	o := resp.Msg.Lease
	clk.Advance(time.Second)
	for _, job := range []string{"C", "O"} {
		r, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "cancel of "+job, r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
	}
	_, d := planner.send(t, renew(k, 1))
	wantDecision(t, "the planner's claim on K", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
	before := map[string]*tetherv1.Lease{}
	for _, job := range []string{"P", "C", "K", "O"} {
		before[job] = w.get(t, job)
	}
	clk.Advance(9 * time.Second)
	w.srv.Stop() // at epoch+10s; every deadline (epoch+60s) falls while it is down

	clk.Set(epoch.Add(200 * time.Second))
	restartAt := clk.Now()
	w.srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.admin, w.w1C, w.plannerC = w.srv.AdminClients(), w.srv.Clients(credentialOf(t, w.srv, w.w1)), w.srv.Clients(credentialOf(t, w.srv, w.planner))
	holder = unary{w.w1C}

	// The control: a plain lease gets its grace. (Each message is judged
	// after the restart plan was applied on its job's shard.)
	_, d = holder.send(t, renew(p, 1))
	wantDecision(t, "P's renew within its grace", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	if rows := w.evidence(t, "P"); rows[len(rows)-2].Message != "recover" ||
		rows[len(rows)-2].ExpiresAt.AsTime().Before(restartAt.Add(30*time.Second)) || rows[len(rows)-2].ExpiresAt.AsTime().After(restartAt.Add(45*time.Second)) {
		t.Fatalf("P was not given the grace (30–45 s after %s) by the restart: %v", restartAt, rows[len(rows)-2])
	}
	for _, tc := range []struct {
		what  string
		m     *tetherv1.ChannelRequest
		event tetherv1.AuditEvent
	}{
		{"C's cancel ack after the restart", cancelAck(c), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
		{"C's CANCELLED after the restart", complete(c, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
		{"K's renew after the restart", renew(k, 1), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
		{"K's FAILED after the restart", complete(k, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
		{"O's ACK after the restart", ack(o), tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED},
	} {
		got, d := holder.send(t, tc.m)
		wantDecision(t, tc.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tc.event)
		if got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
			t.Fatalf("%s: %v", tc.what, got)
		}
	}
	for _, job := range []string{"C", "K", "O"} {
		got, was := w.get(t, job), before[job]
		if !got.ExpiresAt.AsTime().Equal(was.ExpiresAt.AsTime()) || !got.AckDeadline.AsTime().Equal(was.AckDeadline.AsTime()) || !got.LeaseExpired {
			t.Errorf("%s after the restart: %s, expires %s, ACK due %s; want it expired at the deadlines it had (expires %s, ACK due %s)",
				job, got.State, got.ExpiresAt.AsTime(), got.AckDeadline.AsTime(), was.ExpiresAt.AsTime(), was.AckDeadline.AsTime())
		}
		for _, r := range w.evidence(t, job) {
			if r.Message == "recover" {
				t.Errorf("%s: the restart extended it: %v", job, r)
			}
		}
	}
	if got := w.get(t, "K"); !got.OwnershipConflict {
		t.Fatalf("the restart cleared K's conflict: %v", got)
	}
	// What ends them is the coordinator's explicit reconciliation.
	for _, job := range []string{"C", "K", "O"} {
		r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "reconciled after the restart"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "the reconciliation of "+job, r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		if !strings.HasPrefix(r.Msg.Lease.TerminalDetail, "agent:"+w.planner+": ") {
			t.Fatalf("%s's terminal detail does not say who reconciled it: %q", job, r.Msg.Lease.TerminalDetail)
		}
	}
}
