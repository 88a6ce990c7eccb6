package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The second acceptance pass over the two seeds, through the real server:
// the promises the first pass (seed_lease_ext_test.go,
// seed_term_ext_test.go) and the rogue passes left out or checked only for
// a cooperative party.

// Seed 003 (aborting): "aborting cancels those calls and requires an
// acknowledgement from the tool layer of each cancellation", and the
// record says how each call in flight was resolved. A tool server that
// reports a call's end with EndCall after the abort ordered its cancel —
// a gate that never saw the order (its watch was behind), or that let the
// tool finish — has acknowledged nothing: a call it says completed did
// its side effect, one it says failed ended on its own. The record says
// so, with no acknowledgement; only CancelAck is one. It used to record
// both cancelled_acked, acknowledged by the gate: a payment the tool
// server reported sent, recorded as a cancel the gate never acknowledged.
func TestSeed2AnEndAfterTheCancelOrderIsNotAnAcknowledgement(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	var calls []string
	for range 3 {
		id, err := w.begin(w.gC.token)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, id)
	}
	completed, failed, acked := calls[0], calls[1], calls[2]
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the abort's three cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 3
	})
	for _, end := range []*tetherv1.EndCallRequest{{CallId: completed, GateId: "gate-1"}, {CallId: failed, GateId: "gate-1", Failed: true, Error: "upstream 502"}} {
		resp, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(end))
		if err != nil {
			t.Fatal(err)
		}
		// The ledger's answer: the order is kept, no acknowledgement.
		if c := resp.Msg.Call; c.CancelRequestedAt == nil || c.CancelAckedAt != nil || c.AcknowledgedBy != "" {
			t.Errorf("call %s in the ledger: cancel ordered at %v, acknowledged at %v by %q; want the order kept and no acknowledgement", c.CallId, c.CancelRequestedAt, c.CancelAckedAt, c.AcknowledgedBy)
		}
	}
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: acked, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	// Every call has ended: the abort goes on without waiting out its
	// acknowledgement timeout.
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	got := map[string]*tetherv1.RecordToolCall{}
	for _, c := range rec.ToolCalls {
		got[c.CallId] = c
	}
	for _, want := range []struct {
		id         string
		resolution tetherv1.CallResolution
		ackedBy    string
	}{
		{completed, tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED, ""},
		{failed, tetherv1.CallResolution_CALL_RESOLUTION_FAILED, ""},
		{acked, tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED, "tool:gate-1"},
	} {
		c := got[want.id]
		if c == nil {
			t.Errorf("call %s is not in the record", want.id)
			continue
		}
		if c.Resolution != want.resolution || c.AcknowledgedBy != want.ackedBy || c.EndedBy != "tool:gate-1" {
			t.Errorf("call %s: %s acknowledged by %q, ended by %q; want %s acknowledged by %q, ended by tool:gate-1",
				want.id, c.Resolution, c.AcknowledgedBy, c.EndedBy, want.resolution, want.ackedBy)
		}
	}
	if len(rec.ToolCalls) != 3 {
		t.Errorf("record lists %d calls, want 3", len(rec.ToolCalls))
	}
}

// Seed 003 (aborting): the abort waits for each cancel's acknowledgement
// up to its timeout; a call not acknowledged by then is recorded
// cancel_unacknowledged. A rogue's tool server that acknowledges once the
// timeout has run out — after the termination stopped waiting for it and
// went on to revoke — must not turn that call into a cancelled one in the
// record: the tool kept running past the time the termination allowed it.
// The acknowledgement used to be taken as long as the record was not yet
// written (here, while the record waits for the exit confirmations), and
// the record said cancelled_acked. It is refused failed_precondition, at
// the deadline's instant already (whether or not the reconciler has moved
// on yet), and the record says cancel_unacknowledged; an acknowledgement
// before the deadline still counts.
func TestSeed2AnAcknowledgementAfterTheAckTimeoutIsRefused(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	calls, term, ack := w.abortWithFourCalls(t)
	inTime, atDeadline, afterMoving, endedLate := calls[0], calls[1], calls[2], calls[3]
	w.clk.Advance(10*time.Second - time.Millisecond)
	if err := ack(inTime); err != nil {
		t.Fatalf("an acknowledgement a millisecond before the deadline: %v", err)
	}
	w.clk.Advance(time.Millisecond)
	refused := func(call, when string) {
		t.Helper()
		err := ack(call)
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancel_unacknowledged") {
			t.Errorf("an acknowledgement %s: %v; want failed_precondition saying the call is recorded cancel_unacknowledged", when, err)
		}
	}
	refused(atDeadline, "at the deadline's instant")
	// The record waits an hour for exit confirmations: the termination has
	// stopped waiting for acknowledgements and revoked, the record is not
	// written yet.
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	refused(afterMoving, "once the termination went on to revoke")
	// Nor does a report of the call's end dodge the mark.
	_, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: endedLate, GateId: "gate-1", Failed: true, Error: "stopped late"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancel_unacknowledged") {
		t.Errorf("an EndCall after the deadline: %v; want failed_precondition saying the call is recorded cancel_unacknowledged", err)
	}
	w.clk.Advance(time.Hour)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	want := map[string]tetherv1.CallResolution{
		inTime:      tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		atDeadline:  tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
		afterMoving: tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
		endedLate:   tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
	}
	for _, c := range rec.ToolCalls {
		if c.Resolution != want[c.CallId] {
			t.Errorf("call %s recorded %s, want %s", c.CallId, c.Resolution, want[c.CallId])
		}
		delete(want, c.CallId)
	}
	if len(want) != 0 {
		t.Errorf("calls missing from the record: %v", want)
	}
}

// TestSeed2AcknowledgementsAreJudgedOnTheDeadlineTheServerKeeps: the
// first acknowledgement of a termination's calls reads the termination; the
// server keeps its deadline (never changed once set) and judges the next
// ones on it in their own transaction. Those must count exactly as the
// first: in time up to the last instant before the deadline, refused from
// the deadline's instant on, and the record agrees.
func TestSeed2AcknowledgementsAreJudgedOnTheDeadlineTheServerKeeps(t *testing.T) {
	w := newSeedWorld(t)
	calls, term, ack := w.abortWithFourCalls(t)
	first, second, atDeadline, later := calls[0], calls[1], calls[2], calls[3]
	refused := func(call, when string) {
		t.Helper()
		err := ack(call)
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancel_unacknowledged") {
			t.Errorf("an acknowledgement %s: %v; want failed_precondition saying the call is recorded cancel_unacknowledged", when, err)
		}
	}
	w.clk.Advance(10*time.Second - 2*time.Millisecond)
	if err := ack(first); err != nil {
		t.Fatalf("the first acknowledgement, 2 ms before the deadline: %v", err)
	}
	w.clk.Advance(time.Millisecond)
	if err := ack(second); err != nil {
		t.Fatalf("a second acknowledgement, a millisecond before the deadline: %v", err)
	}
	if err := ack(second); err != nil {
		t.Fatalf("the gate's retry of an acknowledgement that counted: %v", err)
	}
	w.clk.Advance(time.Millisecond)
	refused(atDeadline, "at the deadline's instant, judged on the deadline the server keeps")
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	refused(later, "once the termination went on to revoke")
	w.clk.Advance(time.Hour)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	want := map[string]tetherv1.CallResolution{
		first:      tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		second:     tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED,
		atDeadline: tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
		later:      tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED,
	}
	for _, c := range rec.ToolCalls {
		if c.Resolution != want[c.CallId] {
			t.Errorf("call %s recorded %s, want %s", c.CallId, c.Resolution, want[c.CallId])
		}
		delete(want, c.CallId)
	}
	if len(want) != 0 {
		t.Errorf("calls missing from the record: %v", want)
	}
}

// newLeaseWorldIn is newLeaseWorld on a data directory and clock the test
// keeps, so that it can restart the server on them.
func newLeaseWorldIn(t *testing.T, dir string, clk *clock.Manual) *leaseWorld {
	t.Helper()
	return populateLeaseWorld(t, testserver.StartIn(t, dir, testserver.WithClock(clk)), clk)
}

// authority is what a lease says about who may do what until when: every
// field but the evidence flags, which a refused message may set.
func authority(l *tetherv1.Lease) *tetherv1.Lease {
	a := proto.Clone(l).(*tetherv1.Lease)
	a.StaleGeneration, a.LateProgress, a.OwnershipConflict, a.ConflictHolder = false, false, false, ""
	return a
}

// Seed 000 §10 and §11: a terminal result closes the job, and a duplicate
// terminal attempt is an explicit audit event that changes nothing. The
// job's holder completes it SUCCESS; then everyone who could still speak
// about it tries to change that — the holder (another result, a renew,
// progress, a cancel ack), the job's owner and an operator (a cancel
// request, a reassignment that would open generation 2, a resolution to
// FAILED, CANCELLED or UNRESOLVED, an offer of the same job id), and an
// operator's abort of the holder, whose termination reconciles the leases
// it held. Each is judged and kept as an evidence row; none moves the
// result, its time, the generation or the holder, and the termination's
// record reports the job COMPLETED. After a restart of the server on the
// same data directory the job still reads SUCCESS with the same evidence,
// and a reassignment is still refused.
func TestSeed2ATerminalResultIsFinalWhoeverSpeaksAfterIt(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newLeaseWorldIn(t, dir, clk)
	ctx := context.Background()
	job := w.job()
	resp, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	holder := unary{w.w1C}
	l, _ := holder.send(t, ack(resp.Msg.Lease))
	holder.send(t, progress(l, 1, "done"))
	done, d := holder.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "SUCCESS", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	final := authority(done)
	rows := len(w.evidence(t, job))
	unchanged := func(what string) {
		t.Helper()
		rows++
		if got := authority(w.get(t, job)); !proto.Equal(got, final) {
			t.Fatalf("%s changed the finished job:\nbefore %v\nafter  %v", what, final, got)
		}
		if n := len(w.evidence(t, job)); n != rows {
			t.Fatalf("%s: %d evidence rows, want %d (each attempt judged and kept)", what, n, rows)
		}
	}
	clk.Advance(10 * time.Second)

	for _, tc := range []struct {
		what    string
		m       *tetherv1.ChannelRequest
		outcome tetherv1.Outcome
		event   tetherv1.AuditEvent
	}{
		{"the holder's FAILED", complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL},
		{"the holder's SUCCESS again", complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS), tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL},
		{"the holder's renew", renew(l, 1), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION},
		{"the holder's progress", progress(l, 2, "more"), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS},
		{"the holder's cancel ack", cancelAck(l), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION},
		{"the holder's ACK", ack(l), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION},
	} {
		_, d := holder.send(t, tc.m)
		wantDecision(t, tc.what, d, tc.outcome, tc.event)
		unchanged(tc.what)
	}
	for _, c := range []struct {
		who string
		cl  *testserver.Clients
	}{{"the owner", w.plannerC}, {"an operator", w.admin}} {
		r, err := c.cl.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "changed my mind"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, c.who+"'s cancel request", r.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		unchanged(c.who + "'s cancel request")
		re, err := c.cl.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w2, LeaseDuration: durationpb.New(time.Minute), Reason: "run it again"}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, c.who+"'s reassignment", re.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		unchanged(c.who + "'s reassignment")
		for _, result := range []tetherv1.TerminalResult{tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED} {
			rs, err := c.cl.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: result, Reason: "override"}))
			if err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("%s's resolution to %s", c.who, result)
			wantDecision(t, what, rs.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
			unchanged(what)
		}
		of, err := c.cl.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w2, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, c.who+"'s offer of the same job", of.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		unchanged(c.who + "'s offer of the same job")
	}

	// The holder's termination reconciles the leases it held: a finished
	// job is reported as it ended, not cancelled.
	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != job || rec.Leases[0].Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED ||
		rec.Leases[0].LeaseGeneration != 1 || rec.Leases[0].HolderIdentity != w.w1 {
		t.Fatalf("record leases %v, want %s generation 1 of %s COMPLETED", rec.Leases, job, w.w1)
	}
	if got := authority(w.get(t, job)); !proto.Equal(got, final) {
		t.Fatalf("the holder's termination changed the finished job:\nbefore %v\nafter  %v", final, got)
	}
	ev := w.evidence(t, job)

	// Restarted on the same data directory (and store), the job is as it
	// was, and still refuses a reassignment.
	w.srv.Stop()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.srv, w.admin = srv, srv.AdminClients()
	if got := authority(w.get(t, job)); !proto.Equal(got, final) {
		t.Fatalf("after a restart:\nbefore %v\nafter  %v", final, got)
	}
	if again := w.evidence(t, job); len(again) != len(ev) || !proto.Equal(again[len(again)-1], ev[len(ev)-1]) {
		t.Fatalf("after a restart the evidence has %d rows (last %v), want %d (last %v)", len(again), again[len(again)-1], len(ev), ev[len(ev)-1])
	}
	re, err := w.admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w2, LeaseDuration: durationpb.New(time.Minute), Reason: "after the restart"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "a reassignment after the restart", re.Msg.Decision, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
	if got := authority(w.get(t, job)); !proto.Equal(got, final) {
		t.Fatalf("a reassignment after the restart changed the job:\nbefore %v\nafter  %v", final, got)
	}
}

// Seed 000 §6, §11 and §15: a renew is bound to its sequence, and a
// duplicate of an accepted one is ignored without mutation — whenever it
// arrives. A holder replays its last accepted renew (and its ACK) half a
// lease later, hoping the coordinator takes it for a fresh one: both are
// duplicates and the expiry stays where the original put it; an older
// sequence is a stale renew; the next sequence, even far ahead, is simply
// the next. Progress reusing an accepted sequence with another value is
// refused, never applied. Once the expiry passes, nothing — a replay, a
// higher sequence, progress — brings the generation back. Every message
// is one evidence row with its own audit event.
func TestSeed2AReplayedRenewExtendsNothing(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		for seq := uint64(1); seq <= 3; seq++ {
			w.clock.Advance(time.Second)
			_, d := w1.send(t, renew(l, seq))
			wantDecision(t, "renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		}
		w1.send(t, progress(l, 5, "a"))
		accepted := w.get(t, job)
		expiry := accepted.ExpiresAt.AsTime()
		if want := epoch.Add(3 * time.Second).Add(time.Minute); !expiry.Equal(want) {
			t.Fatalf("after renew 3 the lease expires at %s, want %s", expiry, want)
		}
		rows := len(w.evidence(t, job))
		w.clock.Advance(30 * time.Second)
		for _, tc := range []struct {
			what    string
			m       *tetherv1.ChannelRequest
			outcome tetherv1.Outcome
			event   tetherv1.AuditEvent
		}{
			{"renew 3 replayed", renew(l, 3), tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW},
			{"the ACK replayed", ack(l), tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_ACK},
			{"renew 2", renew(l, 2), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW},
			{"progress 5 with another value", progress(l, 5, "b"), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS},
			{"progress 5 replayed", progress(l, 5, "a"), tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS},
		} {
			got, d := w1.send(t, tc.m)
			wantDecision(t, tc.what, d, tc.outcome, tc.event)
			rows++
			if !got.ExpiresAt.AsTime().Equal(expiry) || got.RenewSequence != 3 || got.ProgressSequence != 5 || got.ProgressValue != "a" {
				t.Fatalf("%s moved the lease: expires %s renew %d progress %d %q, want %s, 3, 5, \"a\"",
					tc.what, got.ExpiresAt.AsTime(), got.RenewSequence, got.ProgressSequence, got.ProgressValue, expiry)
			}
			if n := len(w.evidence(t, job)); n != rows {
				t.Fatalf("%s: %d evidence rows, want %d", tc.what, n, rows)
			}
		}
		if got := authority(w.get(t, job)); !proto.Equal(got, authority(accepted)) {
			t.Fatalf("the replays changed the lease:\nbefore %v\nafter  %v", accepted, got)
		}
		// The next sequence, however far ahead, is the next renew.
		next, d := w1.send(t, renew(l, 1000))
		wantDecision(t, "renew 1000", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		expiry = next.ExpiresAt.AsTime()
		if want := w.clock.Now().Add(time.Minute); !expiry.Equal(want) {
			t.Fatalf("renew 1000: expires %s, want %s", expiry, want)
		}
		// Past the expiry, nothing revives the generation. The replay of
		// the accepted renew is a duplicate there too (forty-fourth pass:
		// it read REJECTED LEASE_EXPIRED, as if the holder had asked for
		// more after the end), and extends nothing.
		w.clock.Advance(time.Minute)
		for _, tc := range []struct {
			what    string
			m       *tetherv1.ChannelRequest
			outcome tetherv1.Outcome
			event   tetherv1.AuditEvent
		}{
			{"renew 1000 replayed after the expiry", renew(l, 1000), tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW},
			{"renew 1001 after the expiry", renew(l, 1001), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
			{"the ACK after the expiry", ack(l), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
			{"progress after the expiry", progress(l, 6, "c"), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS},
			{"success after the expiry", complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS), tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED},
		} {
			got, d := w1.send(t, tc.m)
			wantDecision(t, tc.what, d, tc.outcome, tc.event)
			if got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || !got.LeaseExpired || got.RenewSequence != 1000 || got.ProgressSequence != 5 || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
				t.Fatalf("%s: %v, want generation 1 EXPIRED at renew 1000, progress 5, no result", tc.what, got)
			}
		}
	})
}

// Seed 000 §5, §7 and §10: delivery is an offer, not authority, and the
// coordinator's deadlines are instants. A holder that never ACKs acts as
// if it owned the job — renew, progress, success — and is refused each
// time, the offer unchanged; its ACK at the very instant of the deadline
// is too late. A holder that did ACK loses its authority at the very
// instant its lease expires: a renew or a success arriving then is
// refused, a nanosecond earlier it is accepted.
func TestSeed2AuthorityBeginsWithTheAckAndEndsAtTheInstantDeclared(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		ctx := context.Background()
		job := w.job()
		resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1,
			LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(5 * time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		offered := resp.Msg.Lease
		for _, tc := range []struct {
			what string
			m    *tetherv1.ChannelRequest
		}{
			{"a renew before the ACK", renew(offered, 1)},
			{"progress before the ACK", progress(offered, 1, "10%")},
			{"success before the ACK", complete(offered, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)},
			{"a cancel ack before the ACK", cancelAck(offered)},
		} {
			_, d := w1.send(t, tc.m)
			wantDecision(t, tc.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
			if got := authority(w.get(t, job)); !proto.Equal(got, authority(offered)) {
				t.Fatalf("%s changed the offer:\nbefore %v\nafter  %v", tc.what, offered, got)
			}
		}
		w.clock.Set(offered.AckDeadline.AsTime())
		late, d := w1.send(t, ack(offered))
		wantDecision(t, "an ACK at the deadline", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_ACK_DEADLINE_MISSED)
		if late.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || late.AckState != tetherv1.AckState_ACK_STATE_MISSED || late.ExpiresAt != nil {
			t.Fatalf("after the ACK at the deadline: %v", late)
		}

		job2 := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job2, w.w1, time.Minute)))
		w.clock.Set(l.ExpiresAt.AsTime().Add(-time.Nanosecond))
		l, d = w1.send(t, renew(l, 1))
		wantDecision(t, "a renew a nanosecond before the expiry", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		w.clock.Set(l.ExpiresAt.AsTime())
		_, d = w1.send(t, renew(l, 2))
		wantDecision(t, "a renew at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		got, d := w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		if got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || got.RenewSequence != 1 {
			t.Fatalf("after the expiry: %v", got)
		}
	})
}

// Seed 003: the termination is a persisted desired state, and a restart
// of the control plane neither forgives a deadline nor loses a step. An
// operator drains parent P (child C, each with a grant; P with a file lock
// whose revoke hook answers; C holding a job lease it ACKed); C has two
// calls in flight. The gate ends one within the window. The server is
// stopped, and the drain window runs out while it is down: restarted, the
// termination escalates at once, on the clock it started on (the window
// is not started again), and orders the cancel of the call left. Stopped
// again, the acknowledgement timeout runs out: restarted, the termination
// revokes and reconciles without waiting any longer. The launcher attests
// both exits. The one record says it
// all: phases requested → draining → aborting → reconciling, escalated,
// the first call completed and the second cancel_unacknowledged, both
// grants and the lock revoked, the lease UNRESOLVED (C never acknowledged
// its cancel and still had authority), both nodes confirmed by the
// launcher; the JSON the record sink wrote validates against
// docs/record.schema.json and is the record the API serves.
func TestSeed2ARestartResumesATerminationOnTheClockItStartedOn(t *testing.T) {
	hooked := make(chan string, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			ExternalID string `json:"external_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		hooked <- body.ExternalID
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	start := func() (*testserver.Server, *testserver.Clients) {
		srv := testserver.StartIn(t, dir, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
		return srv, srv.AdminClients()
	}
	srv, admin := start()
	ctx := context.Background()
	p := register(t, admin, "parent")
	pAgent := srv.Clients(p.Credential)
	c := spawn(t, pAgent, p.Node.NodeId, "child")
	cAgent := srv.Clients(c.Credential)
	gP := issueRoot(t, admin, p.Node.NodeId, time.Hour, "tool:*")
	gC := delegate(t, pAgent, gP, c.Node.NodeId, "tool:shell")
	if _, err := admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: p.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/p", ExpiresAt: timestamppb.New(clk.Now().Add(time.Hour)), RevokeUrl: hook.URL,
	})); err != nil {
		t.Fatal(err)
	}
	offered, err := pAgent.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "index", HolderIdentity: c.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := unary{cAgent}.send(t, ack(offered.Msg.Lease))
	gateToken := srv.ToolServerToken(t, "gate-1")
	gate := srv.Clients(gateToken)
	var calls []string
	for range 2 {
		resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: gC.token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, resp.Msg.Call.CallId)
	}
	finished, hanging := calls[0], calls[1]

	term := terminate(t, admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 20*time.Second, time.Minute)
	requested := clk.Now()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	clk.Advance(5 * time.Second)
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: finished, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	clk.Advance(6 * time.Second) // the window ran out while the server was down
	srv, admin = start()
	testserver.WaitFor(t, 20*time.Second, "the escalation and its cancel order after the restart", func() bool {
		got := getTermination(t, admin, term.TerminationId)
		return got.State == tetherv1.TerminationState_TERMINATION_STATE_ABORTING && got.Escalated && got.Progress.GetAcksPending() == 1
	})
	srv.Stop()

	clk.Advance(21 * time.Second) // the acknowledgement timeout ran out while it was down
	srv, admin = start()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	for _, id := range []string{c.Node.NodeId, p.Node.NodeId} {
		if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "launcher: process gone"})); err != nil {
			t.Fatal(err)
		}
	}
	final := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	rec := record(t, admin, term.TerminationId)
	wantHeader(t, rec, final, "requested", "draining", "aborting", "reconciling")
	if !rec.Escalated {
		t.Error("the record does not say the drain escalated")
	}
	if ab := rec.Phases[2]; ab.StartedAt.AsTime().Before(requested.Add(10 * time.Second)) {
		t.Errorf("aborting started at %s, before the drain window (10s from %s) ran out", ab.StartedAt.AsTime(), requested)
	}
	if got := callIDs(rec); len(got) != 2 || got[finished] != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || got[hanging] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Errorf("record calls %v, want %s completed and %s cancel_unacknowledged", got, finished, hanging)
	}
	privs := map[string]tetherv1.PrivilegeOutcome{}
	for _, pr := range rec.Privileges {
		privs[pr.ExternalId] = pr.Outcome
	}
	want := map[string]tetherv1.PrivilegeOutcome{
		gP.grant.GrantId: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED,
		gC.grant.GrantId: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED,
		"/locks/p":       tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED,
	}
	if fmt.Sprint(privs) != fmt.Sprint(want) || len(rec.Privileges) != 3 {
		t.Errorf("record privileges %v, want %v", privs, want)
	}
	if got := <-hooked; got != "/locks/p" {
		t.Errorf("the hook was called for %q", got)
	}
	if len(rec.Leases) != 1 || rec.Leases[0].JobId != "index" || rec.Leases[0].LeaseId != l.LeaseId || rec.Leases[0].Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED {
		t.Errorf("record leases %v, want index UNRESOLVED", rec.Leases)
	}
	nodes := recordNodes(t, rec)
	for _, id := range []string{p.Node.NodeId, c.Node.NodeId} {
		if n := nodes[id]; n.GetOutcome() != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || !strings.HasPrefix(n.GetConfirmedBy(), "operator:") {
			t.Errorf("record node %s: %s confirmed by %q, want confirmed by the launcher", id, n.GetOutcome(), n.GetConfirmedBy())
		}
	}
	if len(nodes) != 2 {
		t.Errorf("record lists %d nodes, want 2", len(nodes))
	}
	recs, err := admin.Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(recs.Msg.Records); n != 1 {
		t.Errorf("%d records after two restarts, want 1", n)
	}
	wantPublishedRecord(t, filepath.Join(dir, "records"), rec)
}

// wantPublishedRecord waits for the record sink's file of rec in dir, and
// checks it against the published schema (docs/record.schema.json, with a
// JSON Schema validator) and against the record the API serves.
func wantPublishedRecord(t *testing.T, dir string, rec *tetherv1.ReconciliationRecord) {
	t.Helper()
	// The sink writes <id>.json.tmp and renames it to <id>.json: only the
	// renamed file is whole.
	file := filepath.Join(dir, rec.RecordId+".json")
	testserver.WaitFor(t, 20*time.Second, "the record sink's file", func() bool {
		_, err := os.Stat(file)
		return err == nil
	})
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	schemaBytes, err := os.ReadFile(filepath.Join("..", "docs", "record.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema jsonschema.Schema
	if err := json.Unmarshal(schemaBytes, &schema); err != nil {
		t.Fatal(err)
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if err := resolved.Validate(doc); err != nil {
		t.Fatalf("the published record %s does not validate against docs/record.schema.json: %v", file, err)
	}
	var published tetherv1.ReconciliationRecord
	if err := protojson.Unmarshal(raw, &published); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&published, rec) {
		t.Fatalf("the published record is not the record the API serves:\npublished %v\nserved    %v", &published, rec)
	}
}

// Seed 000 §7: expiry is the authority boundary on the coordinator's
// declared clock, and an expired generation is never revived — not by a
// restart either. The declared restart policy (GetPolicy: extend) gives a
// deadline that fell while no coordinator was serving a grace period; one
// that fell while the coordinator was up is not extended. Four jobs: E
// expired (and was ticked) while the server ran; X expired at the very
// instant the server stopped (on the coordinator's clock it had no
// authority then: a renew at that instant is refused); D's lease and O's
// ACK deadline fell while the server was down. After the restart E and X
// stay EXPIRED and refuse renew and ACK; D and O got their grace (within
// the declared grace and spread), and their holder renews and ACKs.
func TestSeed2ARestartNeverRevivesAnExpiredGeneration(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newLeaseWorldIn(t, dir, clk)
	ctx := context.Background()
	pol, err := w.admin.Lease.GetPolicy(ctx, connect.NewRequest(&tetherv1.GetPolicyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pol.Msg.Policy.RestartBehavior, "extend") {
		t.Fatalf("the declared restart behaviour is %q; this probe is about extend", pol.Msg.Policy.RestartBehavior)
	}
	holder := unary{w.w1C}
	e, _ := holder.send(t, ack(w.offer(t, "E", w.w1, 10*time.Second)))
	x, _ := holder.send(t, ack(w.offer(t, "X", w.w1, time.Minute)))
	d, _ := holder.send(t, ack(w.offer(t, "D", w.w1, 2*time.Minute)))
	resp, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "O", HolderIdentity: w.w1,
		LeaseDuration: durationpb.New(time.Minute), AckTimeout: durationpb.New(100 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	o := resp.Msg.Lease
	clk.Advance(10 * time.Second)
	testserver.WaitFor(t, 20*time.Second, "E to expire while the server runs", func() bool {
		return w.get(t, "E").State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})
	clk.Set(x.ExpiresAt.AsTime())
	w.srv.Stop() // at X's expiry: its holder's authority ended at this instant

	clk.Set(epoch.Add(200 * time.Second)) // D's expiry and O's ACK deadline fall while it is down
	restartAt := clk.Now()
	w.srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.admin, w.w1C = w.srv.AdminClients(), w.srv.Clients(credentialOf(t, w.srv, w.w1))
	holder = unary{w.w1C}
	for _, l := range []*tetherv1.Lease{e, x} {
		if got := w.get(t, l.JobId); got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			t.Errorf("%s after the restart: %s until %s; it expired at %s, before the server stopped or as it stopped",
				l.JobId, got.State, got.ExpiresAt.AsTime(), l.ExpiresAt.AsTime())
		}
		_, dec := holder.send(t, renew(l, 1))
		wantDecision(t, l.JobId+"'s renew after the restart", dec, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
		_, dec = holder.send(t, ack(l))
		wantDecision(t, l.JobId+"'s ACK after the restart", dec, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED)
	}
	lo, hi := restartAt.Add(30*time.Second), restartAt.Add(45*time.Second)
	if got := w.get(t, "D").ExpiresAt.AsTime(); got.Before(lo) || got.After(hi) {
		t.Errorf("D expires at %s after the restart, want the grace: between %s and %s", got, lo, hi)
	}
	if got := w.get(t, "O").AckDeadline.AsTime(); got.Before(lo) || got.After(hi) {
		t.Errorf("O's ACK is due at %s after the restart, want the grace: between %s and %s", got, lo, hi)
	}
	_, dec := holder.send(t, renew(d, 1))
	wantDecision(t, "D's renew within its grace", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	_, dec = holder.send(t, ack(o))
	wantDecision(t, "O's ACK within its grace", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
}

// Seed 000 §11 and §13: every decision is a row of the evidence matrix,
// with the seed's columns, from which a reviewer rebuilds each transition
// without hidden reasoning; nothing is dropped silently. A job lives a
// long, eventful life — 64 renews (past the rows where the store writes a
// checkpoint and an anchor), progress late and repeated, a duplicate
// renew, an ownership conflict, the coordinator's own expiry, a
// reassignment, the former holder's stale renew, a cancellation with late
// progress, its acknowledgement, CANCELLED, and a refused SUCCESS — and
// after each decision the test reads the lease. After a restart, the
// evidence read in pages of 7 has exactly one row per decision, numbered
// without a gap, in decision order, each row's columns the lease as it
// stood after its decision and its decision the one the caller was
// answered.
func TestSeed2TheEvidenceMatrixRebuildsEveryTransition(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewManual(epoch)
	w := newLeaseWorldIn(t, dir, clk)
	ctx := context.Background()
	job := w.job()
	type step struct {
		what     string
		lease    *tetherv1.Lease
		decision *tetherv1.Decision // nil for the coordinator's own tick
	}
	var steps []step
	took := func(what string, d *tetherv1.Decision) {
		t.Helper()
		steps = append(steps, step{what, w.get(t, job), d})
	}
	offer, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	took("offer", offer.Msg.Decision)
	w1, w2, planner := unary{w.w1C}, unary{w.w2C}, unary{w.plannerC}
	l1, d := w1.send(t, ack(offer.Msg.Lease))
	took("ack", d)
	for seq := uint64(1); seq <= 64; seq++ {
		clk.Advance(time.Second)
		_, d := w1.send(t, renew(l1, seq))
		took(fmt.Sprintf("renew %d", seq), d)
	}
	for _, m := range []struct {
		what string
		via  unary
		m    *tetherv1.ChannelRequest
	}{
		{"progress 14", w1, progress(l1, 14, "70%")},
		{"progress 12", w1, progress(l1, 12, "60%")},
		{"progress 14 again", w1, progress(l1, 14, "70%")},
		{"renew 64 again", w1, renew(l1, 64)},
		{"the planner's claim", planner, renew(l1, 1)},
		{"renew 65 under the conflict", w1, renew(l1, 65)},
	} {
		_, d := m.via.send(t, m.m)
		took(m.what, d)
	}
	clk.Advance(time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the coordinator's expiry", func() bool {
		return w.get(t, job).State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})
	took("tick", nil)
	re, err := w.plannerC.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: job, HolderIdentity: w.w2, LeaseDuration: durationpb.New(time.Minute), Reason: "settle the conflict"}))
	if err != nil {
		t.Fatal(err)
	}
	took("reassign", re.Msg.Decision)
	_, d = w1.send(t, renew(l1, 66))
	took("the former holder's renew", d)
	l2, d := w2.send(t, ack(re.Msg.Lease))
	took("ack of generation 2", d)
	rc, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"}))
	if err != nil {
		t.Fatal(err)
	}
	took("cancel request", rc.Msg.Decision)
	for _, m := range []struct {
		what string
		m    *tetherv1.ChannelRequest
	}{
		{"late progress", progress(l2, 1, "10%")},
		{"cancel ack", cancelAck(l2)},
		{"CANCELLED", complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED)},
		{"SUCCESS after CANCELLED", complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)},
	} {
		clk.Advance(time.Second)
		_, d := w2.send(t, m.m)
		took(m.what, d)
	}

	w.srv.Stop()
	w.srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	w.admin = w.srv.AdminClients()
	var rows []*tetherv1.EvidenceRow
	for token := ""; ; {
		page, err := w.admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageSize: 7, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, page.Msg.Rows...)
		if token = page.Msg.NextPageToken; token == "" {
			break
		}
	}
	if len(rows) != len(steps) {
		t.Fatalf("%d evidence rows for %d decisions", len(rows), len(steps))
	}
	for i, r := range rows {
		s := steps[i]
		if r.Row != uint64(i+1) {
			t.Fatalf("row %d (%s) is numbered %d", i+1, s.what, r.Row)
		}
		if i > 0 && r.DecidedAt.AsTime().Before(rows[i-1].DecidedAt.AsTime()) {
			t.Fatalf("row %d (%s) was decided at %s, before the row before it (%s)", i+1, s.what, r.DecidedAt.AsTime(), rows[i-1].DecidedAt.AsTime())
		}
		if got, want := columns(r), leaseColumns(s.lease); !proto.Equal(got, want) {
			t.Fatalf("row %d (%s) does not say how the lease stood after it:\nrow   %v\nlease %v", i+1, s.what, got, want)
		}
		if s.decision == nil {
			if r.Message != "tick" || r.Decision.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED {
				t.Fatalf("row %d is not the coordinator's expiry: %v", i+1, r)
			}
			continue
		}
		if r.Decision.Outcome != s.decision.Outcome || r.Decision.AuditEvent != s.decision.AuditEvent {
			t.Fatalf("row %d (%s) records %s %s, the caller was answered %s %s", i+1, s.what, r.Decision.Outcome, r.Decision.AuditEvent, s.decision.Outcome, s.decision.AuditEvent)
		}
		if r.Reason == "" {
			t.Fatalf("row %d (%s) has no reason", i+1, s.what)
		}
	}
}

// columns is an evidence row's seed columns, without the decision.
func columns(r *tetherv1.EvidenceRow) *tetherv1.EvidenceRow {
	c := proto.Clone(r).(*tetherv1.EvidenceRow)
	c.Decision, c.Reason, c.Message, c.DecidedAt, c.Row = nil, "", "", nil, 0
	return c
}

// leaseColumns is a lease as an evidence row states it.
func leaseColumns(l *tetherv1.Lease) *tetherv1.EvidenceRow {
	return &tetherv1.EvidenceRow{
		JobId: l.JobId, LeaseId: l.LeaseId, Generation: l.LeaseGeneration, HolderIdentity: l.HolderIdentity,
		IssuedAt: l.IssuedAt, LeaseDuration: l.LeaseDuration, ExpiresAt: l.ExpiresAt, AckDeadline: l.AckDeadline, AckState: l.AckState,
		RenewSequence: l.RenewSequence, RenewTime: l.RenewTime, ProgressSequence: l.ProgressSequence, ProgressValue: l.ProgressValue,
		CancelRequested: l.CancelRequested, CancelAck: l.CancelAck, TerminalResult: l.TerminalResult,
		StaleGeneration: l.StaleGeneration, LateProgress: l.LateProgress, LeaseExpired: l.LeaseExpired, OwnershipConflict: l.OwnershipConflict,
	}
}

// Seed 003 (aborting) across kill -9: a cancel order is the control
// plane's durable word, not a message that dies with the process. The real
// binary aborts an agent with a call in flight and is killed (kill -9)
// once the order is durable, before any gate has heard it. Restarted on
// the same data directory, the tool server's first WatchCancels carries
// that order; the gate acknowledges, the launcher attests the exit, and the
// one record says the call was cancelled and acknowledged by that gate.
func TestSeed2ACancelOrderSurvivesKill9AndReachesTheGate(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	root := register(t, admin, "worker")
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	gateToken := proc.ToolServerToken(t, "gate-1")
	begun, err := proc.Clients(gateToken).Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	call := begun.Msg.Call.CallId
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 10*time.Minute, 10*time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the abort's cancel order", func() bool {
		return getTermination(t, admin, term.TerminationId).Progress.GetAcksPending() == 1
	})
	proc.Kill()

	proc = testserver.StartProcessOn(t, dir, addr)
	admin = proc.Clients(proc.Admin)
	gate := proc.Clients(gateToken)
	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	watch, err := gate.Tool.WatchCancels(wctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	var order *tetherv1.WatchCancelsResponse
	for order == nil || order.CallId == "" {
		if !watch.Receive() {
			t.Fatalf("the gate's watch after the restart ended without the order: %v", watch.Err())
		}
		order = watch.Msg()
	}
	if order.CallId != call || order.TerminationId != term.TerminationId || order.NodeId != root.Node.NodeId {
		t.Fatalf("the order after the restart: %v, want call %s of termination %s", order, call, term.TerminationId)
	}
	stop()
	if _, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId, Reason: "launcher: process gone"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the termination to finish after the restart", func() bool {
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, term.TerminationId)
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].CallId != call || rec.ToolCalls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED || rec.ToolCalls[0].AcknowledgedBy != "tool:gate-1" {
		t.Fatalf("record calls %v, want %s cancelled_acked by tool:gate-1", rec.ToolCalls, call)
	}
	if n := rec.Nodes[0]; n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
		t.Fatalf("record node %v, want confirmed by the launcher", n)
	}
}

// Seed 000 §9 and §10 in the record: SUCCESS, FAILED and CANCELLED are
// different ends, an expiry without a result is not success, and a job
// whose end cannot be told is UNRESOLVED. A worker holds six jobs when an
// operator aborts it: one it completed SUCCESS, one FAILED, one whose lease
// ran out without a result, one whose cancel it acknowledges, one whose
// cancel it ignores, and one offer it never ACKed. The record lists each
// with how the lease ended and the job's terminal result, the same the
// lease itself states: a FAILED job is no longer indistinguishable from a
// successful one (both were only COMPLETED).
func TestSeed2TheRecordSaysHowEachJobEnded(t *testing.T) {
	w := newLeaseWorld(t)
	holder := unary{w.w1C}
	held := func(job string, d time.Duration) *tetherv1.Lease {
		t.Helper()
		l, _ := holder.send(t, ack(w.offer(t, job, w.w1, d)))
		return l
	}
	lapsed := held("lapsed", 10*time.Second)
	ok, bad := held("ok", 10*time.Minute), held("bad", 10*time.Minute)
	held("acks-cancel", 10*time.Minute)
	held("ignores-cancel", 10*time.Minute)
	w.offer(t, "never-acked", w.w1, 10*time.Minute)
	_, d := holder.send(t, complete(ok, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "SUCCESS", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	_, d = holder.send(t, complete(bad, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED))
	wantDecision(t, "FAILED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	w.clock.Advance(11 * time.Second)
	testserver.WaitFor(t, 20*time.Second, "the lapsed lease to expire", func() bool {
		return w.get(t, lapsed.JobId).State == tetherv1.LeaseState_LEASE_STATE_EXPIRED
	})

	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	testserver.WaitFor(t, 20*time.Second, "the termination's cancel request", func() bool {
		return w.get(t, "acks-cancel").CancelRequested
	})
	_, d = holder.send(t, cancelAck(w.get(t, "acks-cancel")))
	wantDecision(t, "the cancel ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
	w.clock.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)

	type end struct {
		outcome tetherv1.LeaseOutcome
		result  tetherv1.TerminalResult
	}
	want := map[string]end{
		"ok":             {tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS},
		"bad":            {tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED},
		"lapsed":         {tetherv1.LeaseOutcome_LEASE_OUTCOME_EXPIRED, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED},
		"acks-cancel":    {tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED},
		"ignores-cancel": {tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED},
		"never-acked":    {tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED},
	}
	got := map[string]end{}
	for _, l := range rec.Leases {
		got[l.JobId] = end{l.Outcome, l.TerminalResult}
		if now := w.get(t, l.JobId); now.TerminalResult != l.TerminalResult {
			t.Errorf("record says %s ended %s, its lease says %s", l.JobId, l.TerminalResult, now.TerminalResult)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record leases\n%v\nwant\n%v", got, want)
	}
}

// Seed 003 (the single-process assumption): a parent that is gone does not
// leave its child's credentials standing. Parent P claims its own exit and
// closes its session (its node is exited); its child C keeps working with
// the grant P delegated to it. The operator's termination of P — a node
// already gone — still covers its subtree: C's in-flight call is
// cancelled, C's grant (and P's) revoked, C's next call refused, and the
// record lists both nodes, P with its own claim.
func TestSeed2AGoneParentsTerminationStillStopsItsChild(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	sess, err := openSession(t, w.pAgent, w.p.Node.NodeId)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.pAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.p.Node.NodeId, Reason: "parent done"})); err != nil {
		t.Fatal(err)
	}
	sess.close()
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatalf("the child's call after its parent left: %v", err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the child's call to get its cancel order", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 1
	})
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	_, err = w.begin(w.gC.token)
	wantRefused(t, "the child's next call", err, connect.CodePermissionDenied, "revoked")
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 2 || nodes[w.c.Node.NodeId] == nil || nodes[w.p.Node.NodeId] == nil {
		t.Fatalf("record nodes %v, want P and C", nodeOutcomes(rec))
	}
	if c := nodes[w.c.Node.NodeId]; c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Errorf("record: the child is %s, want unaccounted (nobody confirmed it)", c.Outcome)
	}
	if p := nodes[w.p.Node.NodeId]; p.ClaimedBy == "" {
		t.Errorf("record: the parent's own claim is not shown: %v", p)
	}
	if got := callIDs(rec); got[call] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Errorf("record calls %v, want the child's call cancel_unacknowledged", got)
	}
	revoked := map[string]bool{}
	for _, pr := range rec.Privileges {
		revoked[pr.ExternalId] = pr.Outcome == tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED
	}
	if !revoked[w.gP.grant.GrantId] || !revoked[w.gC.grant.GrantId] {
		t.Errorf("record privileges %v, want both grants revoked", rec.Privileges)
	}
}

// Seed 003's state machine as an observer sees it: requested → draining
// → reconciling → terminated, or through aborting, and terminated only
// once the record exists. An operator drains a parent whose child has a
// call the gate never ends; a viewer follows the termination with
// WatchTermination while the window and then the acknowledgement timeout
// run out. Every state it is shown moves forward along the seed's edges
// (draining → aborting only as an escalation, which stays recorded), and
// the first terminated state it sees already names a record that
// GetRecord serves.
func TestSeed2AnObserverSeesOnlyTheSeedsStateMachine(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	if _, err := w.begin(w.gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Minute)
	viewer := w.srv.Clients(viewerToken(t, w.admin, tetherv1.Role_ROLE_VIEWER))
	wctx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	stream, err := viewer.Supervisor.WatchTermination(wctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []*tetherv1.Termination
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for stream.Receive() {
			mu.Lock()
			seen = append(seen, stream.Msg().Termination)
			mu.Unlock()
			if stream.Msg().Termination.GetState() == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
				return
			}
		}
	}()
	// The clock moves on only once the viewer was shown each state.
	shown := func(state tetherv1.TerminationState) {
		t.Helper()
		waitState(t, w.srv, term.TerminationId, state)
		testserver.WaitFor(t, 20*time.Second, "the watch to show "+state.String(), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1].State == state
		})
	}
	shown(tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(11 * time.Second)
	shown(tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(11 * time.Second)
	shown(tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	<-done

	edges := map[[2]tetherv1.TerminationState]bool{}
	for _, e := range [][2]tetherv1.TerminationState{
		{tetherv1.TerminationState_TERMINATION_STATE_REQUESTED, tetherv1.TerminationState_TERMINATION_STATE_DRAINING},
		{tetherv1.TerminationState_TERMINATION_STATE_DRAINING, tetherv1.TerminationState_TERMINATION_STATE_ABORTING},
		{tetherv1.TerminationState_TERMINATION_STATE_DRAINING, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING},
		{tetherv1.TerminationState_TERMINATION_STATE_ABORTING, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING},
		{tetherv1.TerminationState_TERMINATION_STATE_RECONCILING, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED},
	} {
		edges[e] = true
	}
	var path []string
	var last *tetherv1.Termination
	for _, got := range seen {
		if last != nil && got.State != last.State {
			if !edges[[2]tetherv1.TerminationState{last.State, got.State}] {
				// A watch may coalesce states, but never go back or jump
				// over an edge the seed does not have.
				if got.State <= last.State {
					t.Fatalf("the watch went from %s back to %s (path %v)", last.State, got.State, path)
				}
			}
			if last.State == tetherv1.TerminationState_TERMINATION_STATE_DRAINING && got.State == tetherv1.TerminationState_TERMINATION_STATE_ABORTING && !got.Escalated {
				t.Fatalf("draining became aborting without an escalation: %v", got)
			}
		}
		if last != nil && last.Escalated && !got.Escalated {
			t.Fatalf("the escalation was forgotten: %v", got)
		}
		if got.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
			if got.RecordId == "" {
				t.Fatalf("terminated without a record: %v", got)
			}
			if r := record(t, viewer, term.TerminationId); r.RecordId != got.RecordId {
				t.Fatalf("the terminated state names record %s, GetRecord serves %s", got.RecordId, r.RecordId)
			}
		}
		if len(path) == 0 || path[len(path)-1] != got.State.String() {
			path = append(path, got.State.String())
		}
		last = got
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the watch ended with %v (path %v)", err, path)
	}
	if last.GetState() != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED || !last.Escalated {
		t.Fatalf("the watch's last state %v (path %v), want terminated and escalated", last, path)
	}
	for _, want := range []string{"TERMINATION_STATE_DRAINING", "TERMINATION_STATE_ABORTING", "TERMINATION_STATE_RECONCILING"} {
		if !strings.Contains(strings.Join(path, " "), want) {
			t.Errorf("the watch never showed %s (path %v)", want, path)
		}
	}
	t.Logf("path seen: %v", path)
}

// abortWithFourCalls begins four calls on C's grant through gate-1, aborts
// P's subtree with a 10 s acknowledgement timeout, waits for the four
// cancel orders, and returns the calls, the termination and the gate's
// CancelAck of one call.
func (w *seedWorld) abortWithFourCalls(t *testing.T) ([]string, *tetherv1.Termination, func(call string) error) {
	t.Helper()
	var calls []string
	for range 4 {
		id, err := w.begin(w.gC.token)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, id)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 10*time.Second, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the abort's four cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 4
	})
	ack := func(call string) error {
		_, err := w.gate.Tool.CancelAck(context.Background(), connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"}))
		return err
	}
	return calls, term, ack
}
