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

// The sixth acceptance pass over the job-lease seed (000, "Lease Protocol:
// Ack, Renew, Cancel, Progress"), read line by line as the owners' probes
// would read it, playing a hostile worker as well as a cooperative one.
// Every promise, and the test that holds it through the real server (this
// file's tests are marked *; the SDK columns are agentsdk/typescript/test/
// seed.test.ts and agentsdk/python/tests/test_seed.py):
//
//	§1  delivery is not ownership; ACK, authority, renew, progress, cancel,
//	    expiry and terminal result are separate auditable states
//	      TestSeed2TheEvidenceMatrixRebuildsEveryTransition, TestSeed2AnObserverSeesOnlyTheSeedsStateMachine
//	§2  the lease owns identity, generation, holder binding, ACK deadline,
//	    expiry, renew and progress sequences, cancellation, terminal
//	    reconciliation; spool/replay lives outside it (the SDKs)
//	      TestGetLeaseShowsKubernetesStyleFields; SDK seed tests (replayed result, stale generation)
//	§3  a lease records job_id, lease_id, generation, holder, issued_at,
//	    lease_duration, expires_at; authority only for that generation and
//	    window; a lease id never repeats across generations
//	      TestGetLeaseShowsKubernetesStyleFields, TestSeed2AuthorityBeginsWithTheAckAndEndsAtTheInstantDeclared,
//	      TestRestartKeepsAReassignedLeasesGenerationAndFencesTheFormerHolder
//	§4  duration measured from the last renew time; transitions counted
//	      TestGetLeaseShowsKubernetesStyleFields, *TestSeed6AKill9MidStreamLeavesAPrefixAndReplaysIdempotently (expiry = renew time + duration after a crash)
//	§5  an offer is not authority; ACK before ack_deadline is acceptance,
//	    never success; a missed ACK expires or reassigns per policy
//	      TestSeedLeaseAckDeadlineIsTheCoordinators, TestSeed2AnAcknowledgementAfterTheAckTimeoutIsRefused,
//	      TestLeaseProbeAckIsNotCompletion, TestLeaseReassignPolicyStopsAfterItsBound,
//	      *TestSeed6ARogueSpendingTheLineagesBudgetCannotMakeItsSiblingMissAnAck (a sibling cannot make the ACK miss: FIXED)
//	§6  a renew is bound to lease id + generation + holder + sequence, valid
//	    before expiry, must advance the sequence; a late renew of 7 never
//	    extends 7 once 8 is active
//	      TestLeaseProbeLateRenewFromAnExpiredGeneration, TestSeed2AReplayedRenewExtendsNothing,
//	      TestLeaseFormerHolderLateRenewIsRecordedStale, *TestSeed6SequencesSkipButNeverWrap (skipped, wrapped,
//	      replayed, negative and huge sequences)
//	§7  expiry is the authority boundary on the coordinator's declared clock;
//	    old messages are kept for audit and revive nothing
//	      TestSeed1EveryTimeInTheMatrixIsTheCoordinators, TestSeedLeaseProgressDatedInTheFutureDecidesNothing,
//	      TestSeed2ARestartNeverRevivesAnExpiredGeneration, *TestSeed6AFormerHolderIsHeardUntilEightHoldersLater
//	§8  progress bound to the active generation, sequence must advance; 12
//	    after 14 keeps 14 and records 12; progress never renews
//	      TestLeaseProbeProgressNeverRegresses, *TestSeed6ProgressAtTheInstantOfExpiryIsLateEvidence,
//	      *TestSeed6SequencesSkipButNeverWrap
//	§9  cancel_requested and cancel_ack are separate, neither ends the job;
//	    late progress is late evidence; the end is an explicit CANCELLED,
//	    FAILED or bounded UNRESOLVED
//	      TestLeaseProbeCancelDuringDisconnect, TestSeedLeaseCancelAckNeedsARequestAndEndsNothing,
//	      TestSeedLeaseUnresolvedIsBoundedOnTheCoordinatorsClock, TestSeed4CancelledNeedsACancelRequestWhoeverReconciles,
//	      *TestSeed6ACancelAckSpeaksOnlyForTheGenerationThatWasAsked (a former holder acking a cancel it was never sent)
//	§10 a terminal result is bound to the active generation and accepted
//	    within the contract; an ACKed lease that expired is not success
//	      TestSeed2ATerminalResultIsFinalWhoeverSpeaksAfterIt, TestSeed1AStaleGenerationsResultIsRefusedWhenItsHolderHoldsTheNext,
//	      TestSeed4AStaleResultKeepsWhatItClaimed, *TestSeed6ProgressAtTheInstantOfExpiryIsLateEvidence
//	§11 stale generation, late progress, duplicate renew and duplicate
//	    terminal attempt get explicit audit events; only an exact repeat is
//	    an idempotent duplicate; a lower generation or another holder never
//	    changes the active lease
//	      TestLeaseBadInputChangesNothing, TestLeaseStrangerCannotJamAnotherTreesJob, TestSeed4ATerminalResultInOtherWordsIsNoRepeat,
//	      *TestSeed6AKill9MidStreamLeavesAPrefixAndReplaysIdempotently (result twice with other content, across kill -9),
//	      *TestSeed6AResolutionIsARepeatOnlyOfTheCoordinatorsOwnWords (the coordinator's side: FIXED)
//	§12 two holders claiming one active generation is an ownership conflict
//	    that halts execution and auto-promotion until resolved; a strong
//	    heartbeat does not clear it
//	      TestLeaseRecordedConflictHaltsUntilResolved, TestLeaseConflictSurvivesKill9, TestRolloutDoesNotHandOverAConflictedLease,
//	      TestSeed1ARestartGivesNoGraceToACancelledOrConflictedLease
//	§13 the evidence matrix's 18 columns per case, one row per message; a
//	    reviewer rebuilds every transition from the rows alone
//	      TestSeed2TheEvidenceMatrixRebuildsEveryTransition, TestSeed1ACoordinatorCannotWriteTheHoldersEvidence,
//	      TestLeaseRogueCannotReadOrForgeEvidenceThroughPackedRows, TestSeed4ARefusedCoordinatorMessageNamesWhoSentIt,
//	      *TestSeed6ACancelAckSpeaksOnlyForTheGenerationThatWasAsked (the row names the sender, not the holder),
//	      *TestSeed6AKill9MidStreamLeavesAPrefixAndReplaysIdempotently (one row per held message, no gap, after kill -9)
//	§14 the four probes: late renew of 7 with 8 active; ACK without result;
//	    progress 12 after 14; cancel + late progress during a disconnect
//	      TestLeaseProbeLateRenewFromAnExpiredGeneration, TestLeaseProbeAckIsNotCompletion,
//	      TestLeaseProbeProgressNeverRegresses, TestLeaseProbeCancelDuringDisconnect
//	§15 on a reordering stream each message is judged on its own identity,
//	    generation, sequence and timestamp; arrival order is not authority
//	      TestLeaseChannelReorderingKeepsStateAndAuthority, TestSeed1AReorderedStreamCannotOutrunACancellation,
//	      *TestSeed6AKill9MidStreamLeavesAPrefixAndReplaysIdempotently (a crash mid-stream keeps a prefix)
//
// The hostile worker's moves, each through the server: a stale generation
// writing a result (seed1, seed4); acking a cancel it never received
// (seed_lease, *cancel ack); progress after its deadline (*expiry instant);
// sequences replayed, skipped, wrapped, negative, huge (*sequences); a
// result twice with other content (seed4, *kill -9); forging rows that name
// another sender (seed1, lease_rogue packed rows, *cancel ack); freezing a
// sibling's job by spending the lineage's budget (rogue5 for renewals and
// completion, *ACK — the hole this pass fixed: the sibling's unary ACK was
// refused resource_exhausted until its deadline passed) or by holding a job
// across reassignment (*former holder, restart_probe); the coordinator's
// view after kill -9 mid-sequence (*kill -9). On the coordinator's side, a
// result submitted twice: a Resolve naming the result the holder reported
// was answered DUPLICATE, "repeats the terminal result recorded" — FIXED,
// only its own words again are a repeat now
// (*TestSeed6AResolutionIsARepeatOnlyOfTheCoordinatorsOwnWords). Limits
// left: design §11 (former-holder bound, sequences never wrap, the
// per-node upkeep reserve).

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

// Seed 000 §9 and §11, a cancel acknowledgement from someone the cancel
// was not sent to. The job passed from w1 (generation 1) to w2 (generation
// 2), and the coordinator asked generation 2 to stop. w1 never received
// that request: its acknowledgement under its own generation is stale
// evidence (a row, the acknowledgement not recorded), and under the
// current generation — whose lease id it learnt somehow — it is a
// stranger's and is refused before any judgement, with no row. Only w2's
// own acknowledgement is recorded; it ends nothing, and w2 cannot then
// claim success.
func TestSeed6ACancelAckSpeaksOnlyForTheGenerationThatWasAsked(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		ctx := context.Background()
		job := w.job()
		l1, _ := via(w.w1C).send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		l2, _ := via(w.w2C).send(t, ack(w.reassign(t, job, w.w2, time.Minute)))
		if _, err := w.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop"})); err != nil {
			t.Fatal(err)
		}
		rows := len(w.evidence(t, job))

		former := w.w1C
		got, d, errText := unary{former}.try(t, cancelAck(l1))
		if errText != "" {
			t.Fatalf("the former holder's ack under its own generation: %s", errText)
		}
		wantDecision(t, "the former holder's ack under its own generation", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		if got.LeaseId != "" || got.HolderIdentity != "" {
			t.Fatalf("the former holder read its successor's lease: %v", got)
		}
		if _, _, errText = (unary{former}).try(t, cancelAck(l2)); !strings.HasPrefix(errText, "permission_denied: ") {
			t.Fatalf("the former holder's ack under the current generation: %q, want permission_denied", errText)
		}
		now := w.get(t, job)
		if now.CancelAck || !now.StaleGeneration || now.HolderIdentity != w.w2 || now.OwnershipConflict {
			t.Fatalf("after the former holder's acknowledgements: %v", now)
		}
		ev := w.evidence(t, job)
		if len(ev) != rows+1 {
			t.Fatalf("%d evidence rows, want %d (the stale ack's row, none for the refused one)", len(ev), rows+1)
		}
		// The row is the current lease's (holder w2) and says whose
		// acknowledgement it judged: w1's, not the holder's.
		if row := ev[len(ev)-1]; row.Message != "cancel_ack" || row.HolderIdentity != w.w2 || row.CancelAck ||
			!strings.Contains(row.Reason, `from "`+w.w1+`"`) || strings.Contains(row.Reason, `from "`+w.w2+`"`) {
			t.Fatalf("the stale ack's row: %v", row)
		}

		_, d = via(w.w2C).send(t, cancelAck(l2))
		wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED)
		got, d = via(w.w2C).send(t, complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		wantDecision(t, "success after acknowledging the cancel", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		if got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || !got.CancelAck || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
			t.Fatalf("after the acknowledged cancel: %v", got)
		}
	})
}

// Seed 000 §7, §8 and §9: expiry is the authority boundary, and progress
// that reaches it is late evidence. A holder's progress a nanosecond
// before its expiry is applied and renews nothing; at the instant of the
// expiry it is recorded LATE_PROGRESS, the record keeps the progress it
// had, and the generation is EXPIRED — closed UNRESOLVED by the clock,
// as the cancel request stood (thirty-eighth pass); a cancel
// acknowledgement then, or a result, is refused.
func TestSeed6ProgressAtTheInstantOfExpiryIsLateEvidence(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		ctx := context.Background()
		w1 := via(w.w1C)
		job := w.job()
		l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		expiry := l.ExpiresAt.AsTime()
		w.clock.Set(expiry.Add(-time.Nanosecond))
		got, d := w1.send(t, progress(l, 1, "almost"))
		wantDecision(t, "progress a nanosecond before the expiry", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		if !got.ExpiresAt.AsTime().Equal(expiry) {
			t.Fatalf("progress moved the expiry: %v", got)
		}
		if _, err := w.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop"})); err != nil {
			t.Fatal(err)
		}
		w.clock.Set(expiry)
		got, d = w1.send(t, progress(l, 2, "done"))
		wantDecision(t, "progress at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		// The cancel request stood when the authority ended: the clock
		// closes the job UNRESOLVED, the coordinator's (thirty-eighth pass).
		if got.State != tetherv1.LeaseState_LEASE_STATE_TERMINAL || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED ||
			got.ProgressSequence != 1 || got.ProgressValue != "almost" || !got.LateProgress || !got.LeaseExpired {
			t.Fatalf("after progress at the expiry: %v", got)
		}
		_, d = w1.send(t, cancelAck(l))
		wantDecision(t, "a cancel ack at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_INVALID_TRANSITION)
		got, d = w1.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED))
		wantDecision(t, "a result at the expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		if got.CancelAck || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
			t.Fatalf("after the expired holder's words: %v", got)
		}
	})
}

// Seed 000 §8, §11 and §15 across a crash: the coordinator is killed (-9)
// while a holder's stream of renewals and progress reports is being judged.
// Restarted, the record is a prefix of the stream in its order — never a
// later message without the ones before it — with one evidence row per
// message it holds, numbered without a gap; the holder, resending the
// whole stream, gets a DUPLICATE for the last message of the prefix held,
// its earlier ones answered stale or late, and the rest applied. Its
// terminal result then survives a second kill: the exact repeat is a
// DUPLICATE, other words or another result are refused.
func TestSeed6AKill9MidStreamLeavesAPrefixAndReplaysIdempotently(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc, workerCred, l := processWithAckedJob(t, dir)
	ctx := context.Background()
	const pairs = 150
	value := func(i uint64) string { return "step " + strings.Repeat("#", int(i%7)) }
	stream := proc.Clients(workerCred).Lease.Channel(ctx)
	for i := uint64(1); i <= pairs; i++ {
		r, p := renew(l, i), progress(l, i, value(i))
		r.CorrelationId, p.CorrelationId = 2*i-1, 2*i
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.Receive(); err != nil {
		t.Fatalf("the first answer: %v", err)
	}
	proc.Kill()
	_ = stream.CloseResponse()

	proc = testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	worker := proc.Clients(workerCred)
	got, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	r, p := got.Msg.Lease.RenewSequence, got.Msg.Lease.ProgressSequence
	// A prefix of renew 1, progress 1, renew 2, …: r == p, or r == p+1
	// when it ends with a renew; at least the first answered message.
	if r < 1 || (r != p && r != p+1) || r > pairs {
		t.Fatalf("after kill -9 the record holds renew %d and progress %d: not a prefix of the stream", r, p)
	}
	if p > 0 && got.Msg.Lease.ProgressValue != value(p) {
		t.Fatalf("progress %d holds %q, want %q", p, got.Msg.Lease.ProgressValue, value(p))
	}
	if !got.Msg.Lease.ExpiresAt.AsTime().Equal(got.Msg.Lease.RenewTime.AsTime().Add(10 * time.Minute)) {
		t.Fatalf("expiry %s is not renew time %s plus the lease duration", got.Msg.Lease.ExpiresAt.AsTime(), got.Msg.Lease.RenewTime.AsTime())
	}
	ev, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	rows := ev.Msg.Rows
	// offer, ack, then one row per message of the prefix
	if want := 2 + int(r+p); len(rows) != want {
		t.Fatalf("%d evidence rows for a prefix of %d messages, want %d", len(rows), r+p, want)
	}
	for i, row := range rows {
		if row.Row != uint64(i+1) {
			t.Fatalf("evidence row %d is numbered %d", i+1, row.Row)
		}
	}
	t.Logf("kill -9 left renew %d, progress %d of %d pairs", r, p, pairs)

	channel := openChannel(t, worker)
	for i := uint64(1); i <= pairs; i++ {
		_, d := channel.send(t, renew(l, i))
		switch {
		case i < r:
			wantDecision(t, "a renew of the prefix resent", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_RENEW)
		case i == r:
			wantDecision(t, "the prefix's last renew resent", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW)
		default:
			wantDecision(t, "a renew beyond the prefix", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		}
		_, d = channel.send(t, progress(l, i, value(i)))
		switch {
		case i < p:
			wantDecision(t, "progress of the prefix resent", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_LATE_PROGRESS)
		case i == p:
			wantDecision(t, "the prefix's last progress resent", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_PROGRESS)
		default:
			wantDecision(t, "progress beyond the prefix", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		}
	}
	done := completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "all steps")
	_, d := channel.send(t, done)
	wantDecision(t, "the result", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	proc.Kill()

	proc = testserver.StartProcess(t, dir)
	worker = proc.Clients(workerCred)
	for _, tc := range []struct {
		what string
		m    *tetherv1.ChannelRequest
		out  tetherv1.Outcome
	}{
		{"the result resent after kill -9", completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "all steps"), tetherv1.Outcome_OUTCOME_DUPLICATE},
		{"the result in other words", completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, "most steps"), tetherv1.Outcome_OUTCOME_REJECTED},
		{"another result", completeSaying(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, "all steps"), tetherv1.Outcome_OUTCOME_REJECTED},
	} {
		got, d := unary{worker}.send(t, tc.m)
		wantDecision(t, tc.what, d, tc.out, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
		if got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS || !strings.HasSuffix(got.TerminalDetail, ": all steps") {
			t.Fatalf("%s: %v", tc.what, got)
		}
	}
}

// Seed 000 §7 and §11, a holder the job passed far beyond: old messages
// are kept for audit and revive nothing. A former holder's late traffic
// is judged as stale evidence for as long as it is among the job's last
// lease.MaxFormerHolders holders (8); a holder further back is a stranger
// to the job again, refused before any judgement with no row (design §11
// lists this bound). Either way nothing of the current generation moves.
func TestSeed6AFormerHolderIsHeardUntilEightHoldersLater(t *testing.T) {
	w := newLeaseWorld(t)
	job := w.job()
	first, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	staleRenew := func(t *testing.T) (rowWritten bool, errText string) {
		t.Helper()
		rows := len(w.evidence(t, job))
		before := w.get(t, job)
		_, d, errText := unary{w.w1C}.try(t, renew(first, 1))
		if errText == "" {
			wantDecision(t, "the first holder's late renew", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		}
		after := w.get(t, job)
		if after.LeaseId != before.LeaseId || after.HolderIdentity != before.HolderIdentity || after.State != before.State || after.RenewSequence != before.RenewSequence {
			t.Fatalf("the first holder's late renew moved the lease:\nbefore %v\nafter  %v", before, after)
		}
		return len(w.evidence(t, job)) == rows+1, errText
	}
	for i := 1; i <= 9; i++ {
		next := spawn(t, w.plannerC, w.planner, "next")
		w.reassign(t, job, next.Node.NodeId, time.Minute)
		written, errText := staleRenew(t)
		switch {
		case i <= 8 && (!written || errText != ""):
			t.Fatalf("%d holders later: the first holder's late renew: row %v, %q; want a STALE_GENERATION row", i, written, errText)
		case i == 9 && (written || !strings.HasPrefix(errText, "permission_denied: ")):
			t.Fatalf("9 holders later: the first holder's late renew: row %v, %q; want permission_denied, no row", written, errText)
		}
	}
}

// Seed 000 §11 and §13, the coordinator's side of a result submitted
// twice: only an exact repeat is an idempotent duplicate. The holder
// reported FAILED ("disk full"); the coordinating lineage then resolves
// FAILED with its own reason. That is not a repeat of anything it said —
// the record's result is the holder's — so it is a refused duplicate
// terminal attempt whose row carries its reason, the record's detail
// untouched; answered DUPLICATE, its row read "repeats the terminal
// result recorded", a resolution the coordinator never made. The
// coordinator's own resolution resent word for word stays a DUPLICATE
// (a retry is safe); in other words it is refused, and its bound of an
// UNRESOLVED result cannot be moved by a second UNRESOLVED.
func TestSeed6AResolutionIsARepeatOnlyOfTheCoordinatorsOwnWords(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	resolve := func(job string, result tetherv1.TerminalResult, reason string, bound time.Duration) (*tetherv1.Lease, *tetherv1.Decision) {
		t.Helper()
		req := &tetherv1.ResolveRequest{JobId: job, Result: result, Reason: reason}
		if bound > 0 {
			req.UnresolvedBound = durationpb.New(bound)
		}
		r, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("resolve %s %s: %v", job, result, err)
		}
		return r.Msg.Lease, r.Msg.Decision
	}
	failed := tetherv1.TerminalResult_TERMINAL_RESULT_FAILED

	job := w.job()
	l, _ := unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	_, d := unary{w.w1C}.send(t, completeSaying(l, failed, "disk full"))
	wantDecision(t, "the holder's result", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	detail := w.get(t, job).TerminalDetail
	got, d := resolve(job, failed, "gave up on it", 0)
	wantDecision(t, "the coordinator's FAILED after the holder's", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	if got.TerminalDetail != detail || !strings.Contains(d.Reason, "gave up on it") || strings.Contains(d.Reason, "repeats") {
		t.Fatalf("after the coordinator's FAILED: %v; decision %v", got, d)
	}
	ev := w.evidence(t, job)
	if row := ev[len(ev)-1]; row.Decision.GetOutcome() != tetherv1.Outcome_OUTCOME_REJECTED || !strings.Contains(row.Reason, "gave up on it") {
		t.Fatalf("the coordinator's refused resolution's row: %v", row)
	}

	job = w.job()
	unary{w.w1C}.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
	l, d = resolve(job, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED, "host unreachable", time.Hour)
	wantDecision(t, "UNRESOLVED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
	until := l.UnresolvedUntil.AsTime()
	w.clock.Advance(time.Minute)
	got, d = resolve(job, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED, "host unreachable", time.Hour)
	wantDecision(t, "UNRESOLVED resent word for word", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	if !got.UnresolvedUntil.AsTime().Equal(until) {
		t.Fatalf("a repeated UNRESOLVED moved its bound: %s, was %s", got.UnresolvedUntil.AsTime(), until)
	}
	got, d = resolve(job, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED, "still unreachable", 0)
	wantDecision(t, "UNRESOLVED in other words", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
	if !got.UnresolvedUntil.AsTime().Equal(until) || !strings.HasSuffix(got.TerminalDetail, "host unreachable") {
		t.Fatalf("after UNRESOLVED in other words: %v", got)
	}
	_, d = resolve(job, failed, "host gone", 0)
	wantDecision(t, "FAILED replacing UNRESOLVED", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
	_, d = resolve(job, failed, "host gone", 0)
	wantDecision(t, "FAILED resent word for word", d, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_TERMINAL)
}
