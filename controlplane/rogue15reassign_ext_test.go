package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifteenth hostile pass over job leases, against the job-lease seed
// (000): an operator moves a job out of a tree it does not trust, to an
// agent of another tree. What each test holds:
//
//	TestRogue15AMovedJobLeavesItsOwnersTree (seed §6, §10, and the house
//	    rule "reveals nothing it should not"): the agent that offered the
//	    job (Lease.Owner) and its ancestors kept coordinating it wherever it
//	    went: they read the new holder's lease and evidence, could cancel,
//	    resolve or steal it back to their own descendants, and, claiming
//	    its active generation, record an ownership conflict that halts the
//	    new tree's work. FIXED: the owner's lineage coordinates a job only
//	    while its holder is in the owner's tree; once an operator moves it
//	    to another tree, coordination passes to the operators and the new
//	    holder's ancestors, and the former owner's tree is refused
//	    (PermissionDenied, naming only the job id) — its former holders'
//	    late traffic is still judged and recorded as stale evidence.
//	TestRogue15BNewHolderReadsOnlyItsTreesRows (seed §10, §12): the new
//	    tree's agents read the job's whole evidence matrix, the old tree's
//	    rows included — its holders' node ids, lease ids, progress values,
//	    result details and the late messages they sent after the move.
//	    FIXED: an agent reads the rows of its own tree's generations, with
//	    the other tree's identities withheld from the row that moved the
//	    job, and not the rows of another tree's late messages; an operator
//	    still reads every row, and nothing is deleted.

// movedJob is a job the planner offered to w1 (tree A) that an operator
// then moved to a child of the stranger (tree B), with what tree A said
// about it before and after the move.
type movedJob struct {
	job            string
	l1, l2         *tetherv1.Lease // generation 1 (w1's), generation 2 (the new holder's)
	holder         string          // the new holder, in tree B
	holderC        *testserver.Clients
	secretProgress string // w1's progress before the move
	lateProgress   string // w1's late progress after the move
	lateDetail     string // w1's late completion detail after the move
}

func moveAcrossTrees(t *testing.T, w *leaseWorld) movedJob {
	t.Helper()
	ctx := context.Background()
	m := movedJob{job: w.job(), secretProgress: "tree-A-ledger-row-77 copied",
		lateProgress: "tree-A-still-copying-row-78", lateDetail: "tree-A wrote s3://a-bucket/out.csv"}
	b := spawn(t, w.strangerC, w.stranger, "b1")
	m.holder, m.holderC = b.Node.NodeId, w.srv.Clients(b.Credential)

	resp, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: m.job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	a := unary{w.w1C}
	var d *tetherv1.Decision
	m.l1, d = a.send(t, ack(resp.Msg.Lease))
	wantDecision(t, "w1's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	_, d = a.send(t, progress(m.l1, 1, m.secretProgress))
	wantDecision(t, "w1's progress", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)

	// The operator moves the job to tree B.
	m.l2 = w.reassign(t, m.job, m.holder, time.Minute)
	// Tree A's former holder keeps talking about its generation: judged,
	// recorded as stale evidence (the seed's matrix keeps it).
	_, d = a.send(t, progress(m.l1, 2, m.lateProgress))
	wantDecision(t, "w1's late progress", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
	done := complete(m.l1, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)
	done.GetComplete().Detail = m.lateDetail
	_, d = a.send(t, done)
	wantDecision(t, "w1's late complete", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)

	bt := unary{m.holderC}
	m.l2, d = bt.send(t, ack(m.l2))
	wantDecision(t, "the new holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	_, d = bt.send(t, progress(m.l2, 1, "tree-B-progress"))
	wantDecision(t, "the new holder's progress", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	return m
}

// The planner offered a job, an operator moved it to another tree; the
// planner (and w2, its other child, and w1, the former holder) try to
// read it, cancel it, resolve it, steal it back and halt it with a
// conflict. Each is PermissionDenied naming only the job id, nothing is
// judged or recorded, and the new tree's work goes on; the new holder's
// ancestor and the operator coordinate it.
func TestRogue15AMovedJobLeavesItsOwnersTree(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	m := moveAcrossTrees(t, w)
	before := w.get(t, m.job)
	rowsBefore := len(w.evidence(t, m.job))
	secrets := []string{m.holder, m.l2.LeaseId, w.stranger, "tree-B-progress"}

	for _, who := range []struct {
		name string
		c    *testserver.Clients
	}{{"the former owner", w.plannerC}, {"the former owner's other child", w.w2C}, {"the former holder", w.w1C}} {
		for _, tc := range []struct {
			name string
			call func() error
		}{
			{"get", func() error {
				_, err := who.c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: m.job}))
				return err
			}},
			{"evidence", func() error {
				_, err := who.c.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: m.job}))
				return err
			}},
			{"request cancel", func() error {
				_, err := who.c.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: m.job, Reason: "mine"}))
				return err
			}},
			{"reassign back", func() error {
				_, err := who.c.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: m.job, HolderIdentity: w.w2}))
				return err
			}},
			{"resolve", func() error {
				_, err := who.c.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: m.job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "mine"}))
				return err
			}},
			{"renew claiming the active generation", func() error {
				_, err := who.c.Lease.Renew(ctx, connect.NewRequest(renew(m.l2, 9).GetRenew()))
				return err
			}},
			{"progress claiming the active generation", func() error {
				_, err := who.c.Lease.Progress(ctx, connect.NewRequest(progress(m.l2, 9, "halt").GetProgress()))
				return err
			}},
		} {
			err := tc.call()
			if connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Fatalf("%s %s after the move: %v, want permission_denied", who.name, tc.name, err)
			}
			if found := leaseLeaks(err.Error(), secrets...); len(found) > 0 || !strings.Contains(err.Error(), m.job) {
				t.Fatalf("%s %s: the refusal %q names %v (or not the job)", who.name, tc.name, err, found)
			}
		}
	}
	// Over the Channel, too, the former owner's claim on the active
	// generation is refused before the lease machine.
	ch := openChannel(t, w.plannerC)
	if _, d, errText := ch.try(t, renew(m.l2, 10)); !strings.HasPrefix(errText, "permission_denied: ") || d != nil || len(leaseLeaks(errText, secrets...)) > 0 {
		t.Fatalf("the former owner's renew over its channel: %q %v, want permission_denied naming nothing", errText, d)
	}

	after := w.get(t, m.job)
	if !proto.Equal(before, after) || after.OwnershipConflict || after.CancelRequested {
		t.Fatalf("tree A changed the moved job:\nbefore %v\nafter  %v", before, after)
	}
	if rows := len(w.evidence(t, m.job)); rows != rowsBefore {
		t.Fatalf("tree A wrote %d evidence rows about the moved job", rows-rowsBefore)
	}

	// Tree A's job id stays taken: the former owner cannot re-offer it.
	if _, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: m.job, HolderIdentity: w.w2})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("the former owner re-offering the moved job id: %v", err)
	}

	// The new holder works on: its renewal extends its authority.
	_, d := unary{m.holderC}.send(t, renew(m.l2, 1))
	wantDecision(t, "the new holder's renew", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	// Coordination passed to the new holder's ancestors (and operators).
	if _, err := w.strangerC.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: m.job})); err != nil {
		t.Fatalf("the new holder's ancestor reading the job: %v", err)
	}
	rc, err := w.strangerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: m.job, Reason: "tree B stops it"}))
	if err != nil {
		t.Fatalf("the new holder's ancestor cancelling the job: %v", err)
	}
	wantDecision(t, "tree B's cancel", rc.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
}

// The new tree's holder and its ancestor read the moved job's evidence:
// the rows of tree B's generation, and nothing tree A's agents said — not
// w1's node id, its lease id, its progress, or the late progress and
// result detail it sent after the move. The operator reads every row.
func TestRogue15BNewHolderReadsOnlyItsTreesRows(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	m := moveAcrossTrees(t, w)
	treeA := []string{w.w1, w.planner, m.l1.LeaseId, m.secretProgress, m.lateProgress, m.lateDetail}

	all := w.evidence(t, m.job)
	text := ""
	for _, r := range all {
		text += protojson.Format(r)
	}
	if found := leaseLeaks(text, treeA[:1]...); len(found) != 1 || !strings.Contains(text, m.lateProgress) || !strings.Contains(text, m.lateDetail) || !strings.Contains(text, m.secretProgress) {
		t.Fatalf("the operator does not read every row (nothing may be deleted): %d rows", len(all))
	}

	for _, reader := range []struct {
		name string
		c    *testserver.Clients
	}{{"the new holder", m.holderC}, {"the new holder's ancestor", w.strangerC}} {
		resp, err := reader.c.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: m.job}))
		if err != nil {
			t.Fatalf("%s reading the evidence: %v", reader.name, err)
		}
		rows := resp.Msg.Rows
		var seen strings.Builder
		gen2 := 0
		for _, r := range rows {
			seen.WriteString(protojson.Format(r))
			if r.Generation != 2 || r.HolderIdentity != m.holder {
				t.Errorf("%s reads row %d of generation %d held by %q", reader.name, r.Row, r.Generation, r.HolderIdentity)
			}
			gen2++
		}
		if found := leaseLeaks(seen.String(), treeA...); len(found) > 0 {
			t.Fatalf("%s reads tree A's %q in the moved job's evidence:\n%s", reader.name, found, seen.String())
		}
		// Its own generation: the move (with tree A's names withheld),
		// its ACK and its progress.
		if gen2 != 3 || rows[0].Message != "reassign" || rows[1].Message != "ack" || rows[2].Message != "progress" {
			for _, r := range rows {
				t.Logf("row %d gen %d %s %q", r.Row, r.Generation, r.Message, r.Reason)
			}
			t.Fatalf("%s reads %d rows, want its generation's 3 (reassign, ack, progress)", reader.name, len(rows))
		}
		if !strings.Contains(rows[0].Reason, "(withheld)") || !strings.Contains(rows[0].Reason, m.holder) {
			t.Fatalf("the move's row as %s reads it: %q", reader.name, rows[0].Reason)
		}
		// Page by page, the same rows: a page of tree A's rows is empty
		// and still says where the next one starts.
		var paged []uint64
		token := ""
		for pages := 0; ; pages++ {
			if pages > len(all) {
				t.Fatalf("%s: more pages than rows", reader.name)
			}
			resp, err := reader.c.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: m.job, PageSize: 1, PageToken: token}))
			if err != nil {
				t.Fatalf("%s paging the evidence: %v", reader.name, err)
			}
			for _, r := range resp.Msg.Rows {
				paged = append(paged, r.Row)
			}
			if token = resp.Msg.NextPageToken; token == "" {
				break
			}
		}
		if len(paged) != len(rows) || paged[0] != rows[0].Row || paged[2] != rows[2].Row {
			t.Fatalf("%s reads rows %v page by page, %d at once", reader.name, paged, len(rows))
		}
	}
}
