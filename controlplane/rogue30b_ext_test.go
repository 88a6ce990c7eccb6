package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// The thirtieth hostile pass over the job leases (helper B): a rogue job
// holder, and a rogue agent after other agents' jobs, against the real
// server.

// TestRogue30BFoldedStaleMessagesAreCountedInTheEvidence: a former holder
// past its coordinator.StaleRowsPerFormerHolder rows of a job's evidence
// goes on sending late messages; each is judged and answered, then only
// counted. The counts were read with coordinator.StaleTally alone: the
// Evidence API — what an operator or the job's tree reads — showed the
// first 32 and nothing of the rest, so a reader could not tell a former
// holder that went quiet from one that kept on (seed §11: stale evidence
// is not dropped silently). Every page of the evidence now carries the
// counts; an agent reads its own tree's former holders' counts only.
func TestRogue30BFoldedStaleMessagesAreCountedInTheEvidence(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	root := register(t, admin, "r30b-planner")
	w1 := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "w1")
	w2 := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "w2")
	other := register(t, admin, "r30b-other")
	x := spawn(t, srv.Clients(other.Credential), other.Node.NodeId, "x")
	rogue, holder := srv.Clients(w1.Credential), srv.Clients(w2.Credential)

	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "r30b-fold", HolderIdentity: w1.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	gen1 := offered.Msg.Lease
	if _, err := rogue.Lease.Ack(ctx, connect.NewRequest(ack(gen1).GetAck())); err != nil {
		t.Fatal(err)
	}
	// To w2 (gen 2), then to x of another tree (gen 3), then back to w2
	// (gen 4): w1 and x are both former holders.
	reassign := func(to string) *tetherv1.Lease {
		t.Helper()
		resp, err := admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "r30b-fold", HolderIdentity: to, LeaseDuration: durationpb.New(time.Minute), Reason: "moved"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Lease
	}
	reassign(w2.Node.NodeId)
	gen3 := reassign(x.Node.NodeId)
	gen4 := reassign(w2.Node.NodeId)
	if _, err := holder.Lease.Ack(ctx, connect.NewRequest(ack(gen4).GetAck())); err != nil {
		t.Fatal(err)
	}
	const k = coordinator.StaleRowsPerFormerHolder
	const sent = k + 9
	for seq := uint64(1); seq <= sent; seq++ {
		resp, err := rogue.Lease.Renew(ctx, connect.NewRequest(renew(gen1, seq).GetRenew()))
		if err != nil {
			t.Fatalf("stale renew %d: %v", seq, err)
		}
		if d := resp.Msg.Decision; d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED || d.AuditEvent != tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION {
			t.Fatalf("stale renew %d: %s %s, want REJECTED STALE_GENERATION", seq, d.Outcome, d.AuditEvent)
		}
	}
	xc := srv.Clients(x.Credential)
	if _, err := xc.Lease.Renew(ctx, connect.NewRequest(renew(gen3, 1).GetRenew())); err != nil {
		t.Fatal(err)
	}

	read := func(c *testserver.Clients, pageSize int32) (rows int, pages int, counts map[string]*tetherv1.StaleCount) {
		t.Helper()
		token := ""
		for {
			resp, err := c.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "r30b-fold", PageSize: pageSize, PageToken: token}))
			if err != nil {
				t.Fatal(err)
			}
			pages++
			rows += len(resp.Msg.Rows)
			got := map[string]*tetherv1.StaleCount{}
			for _, c := range resp.Msg.StaleCounts {
				got[c.HolderIdentity] = c
			}
			if counts != nil && len(counts) != len(got) {
				t.Fatalf("page %d carries %d counts, the first %d", pages, len(got), len(counts))
			}
			counts = got
			if token = resp.Msg.NextPageToken; token == "" {
				return rows, pages, counts
			}
		}
	}
	want := func(who string, counts map[string]*tetherv1.StaleCount, holder string, kept, folded uint64) {
		t.Helper()
		c := counts[holder]
		if c.GetKept() != kept || c.GetFolded() != folded {
			t.Errorf("%s: %s's count is %d kept, %d folded; want %d, %d", who, holder, c.GetKept(), c.GetFolded(), kept, folded)
		}
	}
	_, pages, counts := read(admin, 10)
	if pages < 2 {
		t.Fatalf("%d pages of 10 rows; want several", pages)
	}
	if len(counts) != 2 {
		t.Fatalf("the operator reads %d former holders' counts, want 2 (w1 and x): %v", len(counts), counts)
	}
	want("operator", counts, w1.Node.NodeId, k, sent-k)
	want("operator", counts, x.Node.NodeId, 1, 0)

	// The job's tree (its holder, its planner) reads its own former
	// holder's count, never the other tree's.
	for who, c := range map[string]*testserver.Clients{"holder": holder, "planner": srv.Clients(root.Credential)} {
		_, _, counts := read(c, 0)
		if _, ok := counts[x.Node.NodeId]; ok || len(counts) != 1 {
			t.Errorf("%s reads counts %v; want w1's only", who, counts)
		}
		want(who, counts, w1.Node.NodeId, k, sent-k)
	}
	// And the store's tally is what the API shows.
	tally, err := srv.Leases().StaleTally(ctx, "r30b-fold")
	if err != nil {
		t.Fatal(err)
	}
	if len(tally) != 2 {
		t.Fatalf("tally %+v", tally)
	}
}
