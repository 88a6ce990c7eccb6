package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue32CLeaseShowsWhoClosedTheJob: a holder that ignored a cancel
// request acknowledges it after its coordinator resolved the job FAILED.
// The acknowledgement is refused (lease machine), and what an operator
// reads says why: the lease's result is the coordinator's
// (resolved_by_coordinator over the API, "resolved by the coordinator" in
// `tether lease show`), and the evidence table's flags say whether a row's
// lease had the cancel acknowledged ("acked"), where before they showed
// only the request: a refused acknowledgement and an accepted one read the
// same but for the decision.
func TestRogue32CLeaseShowsWhoClosedTheJob(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "lead"}))
	if err != nil {
		t.Fatal(err)
	}
	lead := srv.Clients(root.Msg.Credential)
	w, err := lead.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	worker := srv.Clients(w.Msg.Credential)
	for _, job := range []string{"rogue", "honest"} {
		offered, err := lead.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.Msg.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := worker.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: offered.Msg.Lease.LeaseId, LeaseGeneration: 1})); err != nil {
			t.Fatal(err)
		}
		if _, err := lead.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "stop"})); err != nil {
			t.Fatal(err)
		}
		if job == "rogue" {
			if _, err := lead.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "gave up"})); err != nil {
				t.Fatal(err)
			}
		} else if _, err := worker.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: job, LeaseId: offered.Msg.Lease.LeaseId, LeaseGeneration: 1,
			Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Detail: "(resolved by the coordinator) disk full"})); err != nil {
			t.Fatal(err)
		}
		resp, err := worker.Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{JobId: job, LeaseId: offered.Msg.Lease.LeaseId, LeaseGeneration: 1}))
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome, wantBy := tetherv1.Outcome_OUTCOME_REJECTED, true
		if job == "honest" {
			wantOutcome, wantBy = tetherv1.Outcome_OUTCOME_ACCEPTED, false
		}
		if got := resp.Msg.Decision.GetOutcome(); got != wantOutcome || resp.Msg.Lease.CancelAck != (job == "honest") {
			t.Errorf("%s: the acknowledgement after FAILED is %s (%s), cancel_ack %v; want %s", job, got, resp.Msg.Decision.GetReason(), resp.Msg.Lease.CancelAck, wantOutcome)
		}
		if resp.Msg.Lease.ResolvedByCoordinator != wantBy {
			t.Errorf("%s: resolved_by_coordinator %v, want %v", job, resp.Msg.Lease.ResolvedByCoordinator, wantBy)
		}

		out := tether(t, srv, srv.Admin, "lease", "show", job)
		var terminal string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "terminal:") {
				terminal = line
			}
		}
		// Whose word it is comes before the detail, the holder's own
		// text (the honest one's pretends).
		by := regexp.MustCompile(`^terminal:\s+FAILED at \S+ \((resolved by the coordinator|reported by the holder)\) `).FindStringSubmatch(terminal)
		if want := map[bool]string{true: "resolved by the coordinator", false: "reported by the holder"}[wantBy]; by == nil || by[1] != want {
			t.Errorf("%s: `tether lease show` reads %q; want FAILED at <time> (%s)", job, terminal, want)
		}
		rows := strings.Split(strings.TrimSpace(tether(t, srv, srv.Admin, "lease", "evidence", job)), "\n")
		// The table may end with the holder's late-message counts (its
		// acknowledgement came after its generation ended): the row is
		// the last evidence row, the last one of the table's rows.
		for len(rows) > 0 && !strings.HasPrefix(rows[len(rows)-1], "#") && !regexp.MustCompile(`^\d+\s`).MatchString(rows[len(rows)-1]) {
			rows = rows[:len(rows)-1]
		}
		last := rows[len(rows)-1]
		if f := strings.Fields(last); len(f) < 5 || f[1] != "cancel_ack" || strings.Contains(f[4], "acked") != (job == "honest") {
			t.Errorf("%s: the acknowledgement's row reads %q; want its flags to say acked %v", job, last, job == "honest")
		}
	}
}
