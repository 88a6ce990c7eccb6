package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
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
// the cancel, complete or renew (C and O, whose cancel requests stood, the
// clock closes UNRESOLVED: thirty-eighth pass), and the coordinator
// reconciles them. C's
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
	// C and O, whose cancel requests stood when their authority ended,
	// are closed UNRESOLVED by the clock (thirty-eighth pass); K expired.
	for _, tc := range []struct {
		what   string
		m      *tetherv1.ChannelRequest
		event  tetherv1.AuditEvent
		closed bool
	}{
		{"C's cancel ack after the restart", cancelAck(c), tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION, true},
		{"C's CANCELLED after the restart", complete(c, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED), tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL, true},
		{"K's renew after the restart", renew(k, 1), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED, false},
		{"K's FAILED after the restart", complete(k, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED), tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED, false},
		{"O's ACK after the restart", ack(o), tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION, true},
	} {
		got, d := holder.send(t, tc.m)
		wantDecision(t, tc.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tc.event)
		state, result := tetherv1.LeaseState_LEASE_STATE_EXPIRED, tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED
		if tc.closed {
			state, result = tetherv1.LeaseState_LEASE_STATE_TERMINAL, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED
		}
		if got.State != state || got.TerminalResult != result {
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
	// What ends them is the coordinator's explicit reconciliation (K was
	// never asked to cancel: FAILED, since CANCELLED needs the request).
	for _, job := range []string{"C", "K", "O"} {
		result := tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED
		if job == "K" {
			result = tetherv1.TerminalResult_TERMINAL_RESULT_FAILED
		}
		r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: result, Reason: "reconciled after the restart"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "the reconciliation of "+job, r.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		if !strings.HasPrefix(r.Msg.Lease.TerminalDetail, "agent:"+w.planner+": ") {
			t.Fatalf("%s's terminal detail does not say who reconciled it: %q", job, r.Msg.Lease.TerminalDetail)
		}
	}
}

// Seed 000 §6, §10 and §11: a terminal result is bound to the active
// generation, not to the worker. The job is reassigned to the same holder
// (generation 2, which it ACKs and works on); everything it still sends
// for generation 1 — SUCCESS and FAILED (the result of the run it lost),
// a renew, progress, a cancel ack, the ACK — is stale: answered
// STALE_GENERATION, kept as one evidence row each (the stale flag set,
// the row naming generation 2 as the job's), and generation 2's
// authority, sequences and progress are untouched; generation 2's own
// result is then accepted.
func TestSeed1AStaleGenerationsResultIsRefusedWhenItsHolderHoldsTheNext(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l1, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		w1.send(t, progress(l1, 1, "gen1 10%"))
		l2, d := w1.send(t, ack(w.reassign(t, job, w.w1, time.Minute)))
		wantDecision(t, "the ACK of generation 2", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		w.clock.Advance(time.Second)
		w1.send(t, renew(l2, 1))
		l2, _ = w1.send(t, progress(l2, 1, "gen2 5%"))
		for _, tc := range []struct {
			what string
			m    *tetherv1.ChannelRequest
		}{
			{"generation 1's SUCCESS", complete(l1, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)},
			{"generation 1's FAILED", complete(l1, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)},
			{"generation 1's renew", renew(l1, 7)},
			{"generation 1's progress", progress(l1, 9, "gen1 100%")},
			{"generation 1's cancel ack", cancelAck(l1)},
			{"generation 1's ACK", ack(l1)},
		} {
			rows := len(w.evidence(t, job))
			got, d := w1.send(t, tc.m)
			wantDecision(t, tc.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
			if a, b := authority(got), authority(l2); !proto.Equal(a, b) {
				t.Fatalf("%s changed generation 2:\nbefore %v\nafter  %v", tc.what, b, a)
			}
			ev := w.evidence(t, job)
			if last := ev[len(ev)-1]; len(ev) != rows+1 || !last.StaleGeneration || last.Generation != 2 || last.LeaseId != l2.LeaseId ||
				last.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || last.ProgressValue != "gen2 5%" ||
				!strings.Contains(last.Reason, "gen 1 lease "+strconv.Quote(l1.LeaseId)) {
				t.Fatalf("%s: the evidence (%d rows, want %d) does not keep the stale attempt against generation 2: %v", tc.what, len(ev), rows+1, last)
			}
		}
		if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || !got.StaleGeneration {
			t.Fatalf("after generation 1's attempts: %v", got)
		}
		done, d := w1.send(t, complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "generation 2's SUCCESS", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
		if done.LeaseGeneration != 2 || done.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS {
			t.Fatalf("generation 2's result: %v", done)
		}
	})
}

// Seed 000 §9, §12 and §13, and the trust model: the holder's evidence —
// its ACK, its progress, its cancel acknowledgement, its result — is only
// ever the holder's. The planner that offered the job (its coordinator,
// the holder's parent) tries to write each in the holder's place: an ACK
// of the offer (HOLDER_MISMATCH: the offer stays unacknowledged), then,
// once the holder works on it and a cancel is requested, a cancel ack,
// progress and a CANCELLED result claiming the holder's generation
// (OWNERSHIP_CONFLICT: none is applied, and the conflict halts the job).
// An operator's worker messages are refused before the lease machine, as
// is a resolution to SUCCESS. Each of the planner's rows names the planner
// as the sender and none carries what it claimed. The holder's own cancel
// ack is then accepted, and the planner's resolution is signed as its own.
func TestSeed1ACoordinatorCannotWriteTheHoldersEvidence(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		ctx := context.Background()
		holder, planner := via(w.w1C), via(w.plannerC)
		job := w.job()
		resp, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		offered := resp.Msg.Lease
		from := "from " + strconv.Quote(w.planner)
		plannerRow := func(what string, rows int) *tetherv1.EvidenceRow {
			t.Helper()
			ev := w.evidence(t, job)
			last := ev[len(ev)-1]
			if len(ev) != rows+1 || !strings.Contains(last.Reason, from) {
				t.Fatalf("%s: %d rows, want %d, the last naming the planner as the sender: %v", what, len(ev), rows+1, last)
			}
			return last
		}

		rows := len(w.evidence(t, job))
		_, d := planner.send(t, ack(offered))
		wantDecision(t, "the planner's ACK of the holder's offer", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_HOLDER_MISMATCH)
		if r := plannerRow("the planner's ACK", rows); r.AckState != tetherv1.AckState_ACK_STATE_PENDING {
			t.Fatalf("the planner's ACK row: %v", r)
		}
		if got := w.get(t, job); got.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || got.AckState != tetherv1.AckState_ACK_STATE_PENDING || got.ExpiresAt != nil {
			t.Fatalf("the planner acknowledged the holder's offer: %v", got)
		}

		l, _ := holder.send(t, ack(offered))
		l, _ = holder.send(t, progress(l, 1, "10%"))
		if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			what string
			m    *tetherv1.ChannelRequest
		}{
			{"the planner's cancel ack", cancelAck(l)},
			{"the planner's progress", progress(l, 2, "forged 90%")},
			{"the planner's CANCELLED", complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED)},
			{"the planner's FAILED", complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)},
		} {
			rows := len(w.evidence(t, job))
			_, d := planner.send(t, tc.m)
			wantDecision(t, tc.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT)
			r := plannerRow(tc.what, rows)
			if r.CancelAck || r.ProgressSequence != 1 || r.ProgressValue != "10%" || r.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || !r.OwnershipConflict {
				t.Fatalf("%s: the row carries what the planner claimed: %v", tc.what, r)
			}
		}
		got := w.get(t, job)
		if got.CancelAck || got.ProgressValue != "10%" || got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || !got.OwnershipConflict || got.ConflictHolder != w.planner {
			t.Fatalf("after the planner's claims: %v", got)
		}

		// An operator is no holder at all, and nobody declares success but
		// the holder.
		rows = len(w.evidence(t, job))
		if _, err := w.admin.Lease.CancelAck(ctx, connect.NewRequest(cancelAck(l).GetCancelAck())); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("an operator's cancel ack: %v, want permission_denied", err)
		}
		if _, err := w.admin.Lease.Complete(ctx, connect.NewRequest(complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED).GetComplete())); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("an operator's completion: %v, want permission_denied", err)
		}
		for _, c := range []*testserver.Clients{w.admin, w.plannerC} {
			if _, err := c.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, Reason: "it finished"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("a resolution to SUCCESS: %v, want invalid_argument", err)
			}
		}
		if n := len(w.evidence(t, job)); n != rows {
			t.Fatalf("refused requests wrote %d evidence rows", n-rows)
		}

		// The holder's own acknowledgement is its evidence; the planner's
		// reconciliation is signed as the planner's.
		acked, d := holder.send(t, cancelAck(l))
		wantDecision(t, "the holder's cancel ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
		if !acked.CancelAck {
			t.Fatalf("the holder's cancel ack: %v", acked)
		}
		res, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "stopped"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "the planner's resolution", res.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
		if res.Msg.Lease.TerminalDetail != "agent:"+w.planner+": stopped" || res.Msg.Lease.OwnershipConflict {
			t.Fatalf("the planner's resolution: %v", res.Msg.Lease)
		}
	})
}

// withSentAt dates a worker message on the worker's clock.
func withSentAt(m *tetherv1.ChannelRequest, at time.Time) *tetherv1.ChannelRequest {
	ts := timestamppb.New(at)
	switch v := m.Message.(type) {
	case *tetherv1.ChannelRequest_Ack:
		v.Ack.SentAt = ts
	case *tetherv1.ChannelRequest_Renew:
		v.Renew.SentAt = ts
	case *tetherv1.ChannelRequest_Progress:
		v.Progress.SentAt = ts
	case *tetherv1.ChannelRequest_CancelAck:
		v.CancelAck.SentAt = ts
	case *tetherv1.ChannelRequest_Complete:
		v.Complete.SentAt = ts
	}
	return m
}

// Seed 000 §3, §4, §7 and §13: every time in the evidence matrix is the
// coordinator's observation. A holder dates every message it sends a day
// off, some ahead and some behind: the ACK, three renews, progress, the
// cancel ack and the result. Each row's decision time is the coordinator's
// clock when it judged the message, the renew time the receipt of the
// accepted renew, the expiry one lease duration after the ACK or that
// renew, the issue time and ACK deadline those of the offer; the worker's
// dates appear only in the note that says they were ignored.
func TestSeed1EveryTimeInTheMatrixIsTheCoordinators(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		ctx := context.Background()
		holder := via(w.w1C)
		job := w.job()
		resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1,
			LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(7 * time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		offered := resp.Msg.Lease
		issued := w.clock.Now()
		if !offered.IssuedAt.AsTime().Equal(issued) || !offered.AckDeadline.AsTime().Equal(issued.Add(7*time.Second)) {
			t.Fatalf("the offer: %v, want issued at %s with the ACK due 7s later", offered, issued)
		}
		if _, err := w.plannerC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job})); err != nil {
			t.Fatal(err)
		}
		day := 24 * time.Hour
		var lastRenew time.Time
		var l *tetherv1.Lease = offered
		for i, tc := range []struct {
			what  string
			m     func(l *tetherv1.Lease) *tetherv1.ChannelRequest
			renew bool
			skew  time.Duration
		}{
			{"the ACK", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return ack(l) }, true, -day},
			{"renew 1", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return renew(l, 1) }, true, day},
			{"renew 2", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return renew(l, 2) }, true, -day},
			{"progress", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return progress(l, 1, "1%") }, false, day},
			{"renew 3", func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return renew(l, 3) }, true, day},
		} {
			w.clock.Advance(time.Duration(i+1) * time.Second)
			now := w.clock.Now()
			got, d := holder.send(t, withSentAt(tc.m(l), now.Add(tc.skew)))
			if d.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
				t.Fatalf("%s: %v", tc.what, d)
			}
			l = got
			if tc.renew {
				lastRenew = now
			}
			ev := w.evidence(t, job)
			r := ev[len(ev)-1]
			sent := now.Add(tc.skew).UTC().Format(time.RFC3339Nano)
			switch {
			case !r.DecidedAt.AsTime().Equal(now):
				t.Fatalf("%s was decided at %s by the row, at %s by the coordinator's clock", tc.what, r.DecidedAt.AsTime(), now)
			case !r.ExpiresAt.AsTime().Equal(lastRenew.Add(time.Minute)):
				t.Fatalf("%s: the row's expiry %s, want a minute after the last renewal's receipt %s", tc.what, r.ExpiresAt.AsTime(), lastRenew)
			case r.RenewSequence > 0 && !r.RenewTime.AsTime().Equal(lastRenew):
				t.Fatalf("%s: the row's renew time %s, want the receipt %s", tc.what, r.RenewTime.AsTime(), lastRenew)
			case !r.IssuedAt.AsTime().Equal(issued) || !r.AckDeadline.AsTime().Equal(issued.Add(7*time.Second)):
				t.Fatalf("%s: the row's issue time or ACK deadline moved: %v", tc.what, r)
			case !strings.Contains(r.Reason, "sent_at "+sent) || !strings.Contains(r.Reason, "evidence only"):
				t.Fatalf("%s: the row does not note the worker's date %s as ignored: %s", tc.what, sent, r.Reason)
			}
		}
		// The cancel and the result, dated a day off, are decided at the
		// coordinator's time too; the lease's own times say the same.
		if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
		w.clock.Advance(time.Second)
		acked, _ := holder.send(t, withSentAt(cancelAck(l), w.clock.Now().Add(-day)))
		if !acked.CancelAckedAt.AsTime().Equal(w.clock.Now()) {
			t.Fatalf("the cancel ack is dated %s, the coordinator received it at %s", acked.CancelAckedAt.AsTime(), w.clock.Now())
		}
		w.clock.Advance(time.Second)
		done, _ := holder.send(t, withSentAt(complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED), w.clock.Now().Add(day)))
		if !done.TerminalAt.AsTime().Equal(w.clock.Now()) || !done.RenewTime.AsTime().Equal(lastRenew) || !done.AcquireTime.AsTime().Equal(epoch.Add(time.Second)) {
			t.Fatalf("the finished lease's times are not the coordinator's: %v", done)
		}
	})
}

// Seed 000 §9 and §13 in a termination: when a termination reconciles the
// leases its nodes held, the lease's terminal detail and the evidence row
// of that reconciliation name who asked for the termination. The planner
// (the holder's parent, an agent of the job's lineage) aborts the holder
// with a reason written to read as an operator's; the reconciliation the
// control plane wrote used to carry that text as "terminated: <reason>",
// with no principal — the one reason an agent could still pass for the
// control plane's or an operator's. It now reads "terminated by
// agent:<planner>: <reason>", and an operator's termination names the
// operator.
func TestSeed1ATerminationsReconciliationNamesWhoTerminated(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	holder := unary{w.w1C}
	la, _ := holder.send(t, ack(w.offer(t, w.job(), w.w1, 10*time.Minute)))
	lb, _ := unary{w.w2C}.send(t, ack(w.offer(t, w.job(), w.w2, 10*time.Minute)))
	who, err := w.admin.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	forged := who.Msg.Principal + " aborted the subtree after an incident"
	for _, tc := range []struct {
		c    *testserver.Clients
		node string
		l    *tetherv1.Lease
		by   string
	}{
		{w.plannerC, w.w1, la, "agent:" + w.planner},
		{w.admin, w.w2, lb, who.Msg.Principal},
	} {
		resp, err := tc.c.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: tc.node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: forged,
			CancelAckTimeout: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		term := resp.Msg.Termination
		waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
		w.clock.Advance(2 * time.Second)
		waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		want := "terminated by " + tc.by + ": " + forged
		got := w.get(t, tc.l.JobId)
		if got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED || !strings.HasSuffix(got.TerminalDetail, want) {
			t.Fatalf("the lease after %s's termination: %s, detail %q; want UNRESOLVED with a detail ending %q", tc.by, got.TerminalResult, got.TerminalDetail, want)
		}
		ev := w.evidence(t, tc.l.JobId)
		if last := ev[len(ev)-1]; last.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED || !strings.Contains(last.Reason, want) {
			t.Fatalf("the reconciliation's evidence row does not name %s: %s", tc.by, last.Reason)
		}
	}
}

// Seed 000 §9 and §10 at a restart: an UNRESOLVED reconciliation is bounded
// on the coordinator's clock, and a restart is no second chance. The
// planner cancels its child's job and resolves it UNRESOLVED for two
// minutes; the coordinator stops, and the bound falls while it is down.
// Restarted, the job is FAILED as of the bound (not of the restart), with a
// row that says the bound elapsed: the planner's CANCELLED arriving first
// after the restart is refused DUPLICATE_TERMINAL, and so is the holder's;
// the restart gave the bound no grace.
func TestSeed1AnUnresolvedBoundThatFellDuringARestartClosesTheJobFailed(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newLeaseWorldIn(t, dir, clk)
	ctx := context.Background()
	job := w.job()
	l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "worker unreachable"})); err != nil {
		t.Fatal(err)
	}
	r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED,
		UnresolvedBound: durationpb.New(2 * time.Minute), Reason: "cannot tell whether it stopped"}))
	if err != nil {
		t.Fatal(err)
	}
	bound := r.Msg.Lease.UnresolvedUntil.AsTime()
	clk.Advance(10 * time.Second)
	w.srv.Stop()
	clk.Set(bound.Add(time.Hour))
	w.srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.admin, w.w1C, w.plannerC = w.srv.AdminClients(), w.srv.Clients(credentialOf(t, w.srv, w.w1)), w.srv.Clients(credentialOf(t, w.srv, w.planner))

	late, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "it stopped after all"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the planner's CANCELLED after the bound fell during the downtime", late.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	got := late.Msg.Lease
	if got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED || !got.TerminalAt.AsTime().Equal(bound) {
		t.Fatalf("after the restart: %s at %s, want FAILED at the bound %s", got.TerminalResult, got.TerminalAt.AsTime(), bound)
	}
	_, d := unary{w.w1C}.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
	wantDecision(t, "the holder's CANCELLED after the restart", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	ev := w.evidence(t, job)
	var closing *tetherv1.EvidenceRow
	for _, r := range ev {
		if closing == nil && r.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
			closing = r
		}
	}
	if closing == nil || !strings.Contains(closing.Reason, "UNRESOLVED bound") || !strings.Contains(closing.Reason, "FAILED") {
		t.Fatalf("no row says the bound elapsed and closed the job FAILED: %v", closing)
	}
	for _, r := range ev {
		if r.Message == "recover" {
			t.Fatalf("the restart extended the unresolved job: %v", r)
		}
	}
}

// Seed 000 §9 and §15: on a stream that reorders, cancellation stays
// authoritative whatever the arrival order. Two jobs of one holder are
// cancelled while it is cut off; meanwhile it queued, for each, a renew,
// two progress reports, a cancel ack, SUCCESS and CANCELLED. Reconnected,
// it sends them in one Channel batch: in order for one job, reversed for
// the other. Both jobs end the same: CANCELLED, progress where it stood
// before the cancel (the queued reports late evidence), the renew refused
// and the expiry unmoved, SUCCESS refused; every message answered and kept
// as its own evidence row. Only the audit may differ (a cancel ack after
// the result is refused).
func TestSeed1AReorderedStreamCannotOutrunACancellation(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	holder := unary{w.w1C}
	var jobs []*tetherv1.Lease
	for range 2 {
		l, _ := holder.send(t, ack(w.offer(t, w.job(), w.w1, time.Minute)))
		holder.send(t, renew(l, 1))
		l, _ = holder.send(t, progress(l, 1, "10%"))
		jobs = append(jobs, l)
	}
	w.clock.Advance(time.Second)
	for _, l := range jobs {
		if _, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: l.JobId, Reason: "budget"})); err != nil {
			t.Fatal(err)
		}
	}
	rows := make([]int, len(jobs))
	for i, l := range jobs {
		rows[i] = len(w.evidence(t, l.JobId))
	}
	w.clock.Advance(time.Second)
	queued := func(l *tetherv1.Lease) []*tetherv1.ChannelRequest {
		return []*tetherv1.ChannelRequest{
			renew(l, 2), progress(l, 2, "20%"), progress(l, 3, "30%"), cancelAck(l),
			complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED),
		}
	}
	var all []*tetherv1.ChannelRequest
	all = append(all, queued(jobs[0])...)
	reversed := queued(jobs[1])
	for i := len(reversed) - 1; i >= 0; i-- {
		all = append(all, reversed[i])
	}
	for i, m := range all {
		m.CorrelationId = uint64(i + 1)
	}
	first := all[0]
	first.Batch = all[1:]
	stream := w.w1C.Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]*tetherv1.ChannelResponse{}
	for len(got) < len(all) {
		resp, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range append([]*tetherv1.ChannelResponse{resp}, resp.Batch...) {
			if a.Error != "" || a.Decision == nil || got[a.CorrelationId] != nil {
				t.Fatalf("answer %d: %v", a.CorrelationId, a)
			}
			got[a.CorrelationId] = a
		}
	}
	for i, l := range jobs {
		after := w.get(t, l.JobId)
		if after.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL || after.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED ||
			after.ProgressSequence != 1 || after.ProgressValue != "10%" || after.RenewSequence != 1 || !after.LateProgress ||
			!after.ExpiresAt.AsTime().Equal(l.ExpiresAt.AsTime()) || !after.CancelRequested {
			t.Fatalf("job %d (%s) after its queued messages: %v", i, []string{"in order", "reversed"}[i], after)
		}
		if n := len(w.evidence(t, l.JobId)); n != rows[i]+len(queued(l)) {
			t.Fatalf("job %d: %d new evidence rows for %d messages", i, n-rows[i], len(queued(l)))
		}
	}
	for i, m := range all {
		a := got[uint64(i+1)]
		if c := m.GetComplete(); c != nil && c.Result == tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS && a.Decision.Outcome != tetherv1.Outcome_OUTCOME_REJECTED {
			t.Fatalf("SUCCESS after the cancel: %v", a.Decision)
		}
		if m.GetRenew() != nil && a.Decision.Outcome != tetherv1.Outcome_OUTCOME_REJECTED {
			t.Fatalf("a renew after the cancel: %v", a.Decision)
		}
		if p := m.GetProgress(); p != nil && a.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS {
			t.Fatalf("progress %d after the cancel: %v", p.ProgressSequence, a.Decision)
		}
	}
}

// Seed 000 §10 in a rollout's record: SUCCESS and FAILED are different
// ends, whoever writes the record. A rollout drains an agent whose
// children hold four jobs — one completed SUCCESS, one FAILED, one still
// running (handed over to the replacement) and one whose expiry passed
// without a result. The batch's record lists each with how it ended and,
// for the ones that ended, the terminal result its lease states; the
// handed-over one has none. A rollout's record used to leave the result
// out for every lease, so its FAILED job read like its successful one
// (both COMPLETED), which a termination's record no longer does.
func TestSeed1ARolloutsRecordSaysHowEachJobEnded(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	p := registerLabelled(t, admin, "p", map[string]string{"version": "v1"})
	pc := srv.Clients(p.Credential)
	c1, c2 := spawn(t, pc, p.Node.NodeId, "c1"), spawn(t, pc, p.Node.NodeId, "c2")
	h1, h2 := unary{srv.Clients(c1.Credential)}, unary{srv.Clients(c2.Credential)}
	offer := func(job, holder string, d time.Duration) *tetherv1.Lease {
		resp, err := pc.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(d)}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Lease
	}
	s, _ := h1.send(t, ack(offer("job-s", c1.Node.NodeId, 10*time.Minute)))
	f, _ := h1.send(t, ack(offer("job-f", c1.Node.NodeId, 10*time.Minute)))
	h2.send(t, ack(offer("job-h", c2.Node.NodeId, 10*time.Minute)))
	h2.send(t, ack(offer("job-e", c2.Node.NodeId, time.Second)))
	h1.send(t, complete(s, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	h1.send(t, complete(f, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED))
	clk.Advance(time.Second)
	testserver.WaitFor(t, 20*time.Second, "job-e to expire", func() bool {
		return operatorLease(t, admin, "job-e").State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(time.Hour)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	want := map[string]struct {
		outcome tetherv1.LeaseOutcome
		result  tetherv1.TerminalResult
	}{
		"job-s": {tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS},
		"job-f": {tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED},
		"job-h": {tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER, tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED},
		"job-e": {tetherv1.LeaseOutcome_LEASE_OUTCOME_HANDED_OVER, tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED},
	}
	rec := record(t, admin, term)
	for _, l := range rec.Leases {
		w, ok := want[l.JobId]
		if !ok || l.Outcome != w.outcome || l.TerminalResult != w.result {
			t.Errorf("the rollout's record lists %s as %s with result %s; want %s with %s", l.JobId, l.Outcome, l.TerminalResult, w.outcome, w.result)
		}
		delete(want, l.JobId)
	}
	if len(want) != 0 {
		t.Errorf("jobs missing from the rollout's record: %v", want)
	}
}
