package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-eighth hostile pass over the job leases.
//
// TestRogue38CAHolderStallingACancelHoldsNoPlacePastItsExpiry: the job's
// owner asks its holder to cancel; the rogue holder never acknowledges,
// reports no result and tries to renew (refused), so its authority ends at
// the expiry it had. But the job then stayed EXPIRED and open for ever —
// never reassignable while the cancel request stands, counted in its
// holder's (and lineage's) bound on open leases — until someone resolved
// it: a rogue holder that never answered a cancel kept the job's place,
// and its owner's offers to it were refused resource_exhausted (seen
// failing before the fix: the lease EXPIRED, the owner's next offer
// refused). Now the coordinator's clock closes it when the generation's
// authority ends with the cancel request standing: an explicit, recorded
// UNRESOLVED (seed: a cancellation ends in an explicit terminal
// reconciliation, CANCELLED, FAILED or a bounded unresolved state),
// bounded by the policy's MaxUnresolvedBound, after which it is FAILED;
// the owner may reconcile it CANCELLED or FAILED meanwhile; the rogue can
// neither renew, nor acknowledge, nor report a result after its expiry.
func TestRogue38CAHolderStallingACancelHoldsNoPlacePastItsExpiry(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), rogue38cOneOpenLease)
	stallingHolderEndsUnresolved(t, srv, clk)
}

func TestRogue38CEtcdAHolderStallingACancelHoldsNoPlacePastItsExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd variant; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	st := etcdtest.OpenStore(t, etcdtest.Start(t))
	srv := testserver.Start(t, testserver.WithEtcdStore(st, "replica-0"), testserver.WithClock(clk), rogue38cOneOpenLease)
	testserver.WaitFor(t, replicaWait, "the replica to serve the leases", func() bool {
		serving, _ := srv.Leases().Serving()
		return serving
	})
	stallingHolderEndsUnresolved(t, srv, clk)
}

// rogue38cOneOpenLease holds each agent to one open lease.
func rogue38cOneOpenLease(cfg *controlplane.Config) { cfg.LeaseMaxOpenPerHolder = 1 }

func stallingHolderEndsUnresolved(t *testing.T, srv *testserver.Server, clk *clock.Manual) {
	ctx := context.Background()
	w := populateLeaseWorld(t, srv, clk)
	owner, rogue := w.plannerC, unary{w.w1C}

	l, err := offerTo(owner, w.w1, "r38c-stalled")
	if err != nil {
		t.Fatal(err)
	}
	l, d := rogue.send(t, ack(l))
	wantDecision(t, "the rogue's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	expiry := l.ExpiresAt.AsTime()
	if _, err := owner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: l.JobId, Reason: "stop this job"})); err != nil {
		t.Fatal(err)
	}
	// The rogue does not answer the cancel; it renews (refused) and keeps
	// quiet past its expiry.
	_, d = rogue.send(t, renew(l, 1))
	wantDecision(t, "the rogue's renewal after the cancel request", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
	// Its one open lease is taken meanwhile.
	_, err = offerTo(owner, w.w1, "r38c-next-early")
	refusedForTooMany(t, err, w.w1)

	clk.Set(expiry.Add(time.Second))
	got := w.get(t, l.JobId)
	if got.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
		t.Fatalf("a stalled cancel past the holder's expiry reads %s %s, want TERMINAL UNRESOLVED (the job must end by an explicit reconciliation, not stay open)", got.State, got.TerminalResult)
	}
	if !got.TerminalAt.AsTime().Equal(expiry) || !got.UnresolvedUntil.AsTime().Equal(expiry.Add(srv.Leases().Policy().MaxUnresolvedBound)) {
		t.Fatalf("closed at %s until %s, want at the expiry %s for the policy's unresolved bound", got.TerminalAt.AsTime(), got.UnresolvedUntil.AsTime(), expiry)
	}
	if !strings.Contains(got.TerminalDetail, "never acknowledged") || !strings.Contains(got.TerminalDetail, "cannot be told") {
		t.Fatalf("the recorded end does not say why: %q", got.TerminalDetail)
	}
	var closing *tetherv1.EvidenceRow
	for _, r := range w.evidence(t, l.JobId) {
		if r.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
			closing = r
			break
		}
	}
	if closing == nil || !strings.Contains(closing.Decision.GetReason(), "never acknowledged") {
		t.Fatalf("no evidence row records the close: %v", closing)
	}

	// The place is free: the owner offers its agent the next job.
	if _, err := offerTo(owner, w.w1, "r38c-next"); err != nil {
		t.Fatalf("the owner's offer to the holder once its stalled job was closed: %v, want it accepted", err)
	}

	// The rogue cannot turn the end into its own word.
	for what, m := range map[string]*tetherv1.ChannelRequest{
		"cancel acknowledgement": cancelAck(l),
		"CANCELLED":              complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED),
		"FAILED":                 complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED),
		"renewal":                renew(l, 2),
	} {
		after, d := rogue.send(t, m)
		if d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || after.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
			t.Fatalf("the rogue's %s after the close: %s %s, lease %s", what, d.Outcome, d.AuditEvent, after.TerminalResult)
		}
	}

	// The owner reconciles it meanwhile; the clock would have made it
	// FAILED at the bound.
	res, err := owner.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: l.JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: "the holder stopped, as its tool logs show"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the owner's reconciliation", res.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)

	// Left alone, the bound closes it FAILED.
	l2, err := offerTo(owner, w.w2, "r38c-left-alone")
	if err != nil {
		t.Fatal(err)
	}
	l2, _ = unary{w.w2C}.send(t, ack(l2))
	if _, err := owner.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: l2.JobId, Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	clk.Set(l2.ExpiresAt.AsTime().Add(srv.Leases().Policy().MaxUnresolvedBound))
	if got := w.get(t, l2.JobId); got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
		t.Fatalf("a stalled cancel past the unresolved bound reads %s %s, want FAILED", got.State, got.TerminalResult)
	}
}
