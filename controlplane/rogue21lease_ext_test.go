package controlplane_test

import (
	"context"
	"errors"
	"fmt"
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

// The twenty-first hostile pass over the job leases: a rogue agent holding
// a valid credential for its own node, against the real server.

// offerTo has c offer job to holder and returns the lease, or the error.
func offerTo(c *testserver.Clients, holder, job string) (*tetherv1.Lease, error) {
	resp, err := c.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{
		JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(5 * time.Minute),
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Lease, nil
}

// refusedForTooMany checks that err is the bounds' refusal, in the user's
// words, naming what.
func refusedForTooMany(t *testing.T, err error, what string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
		t.Fatalf("got %v, want resource_exhausted", err)
	}
	if !strings.Contains(ce.Message(), what) || !strings.Contains(ce.Message(), "open leases") {
		t.Fatalf("the refusal says %q, want it to name %q and its open leases", ce.Message(), what)
	}
}

// TestRogue21ALineageCannotMakeTheServerKeepUnboundedOpenLeases: nothing
// bounded the leases one node held or one lineage had the server keep —
// each offer one request of the lineage's budget — so a rogue could have
// its child hold twenty thousand open jobs (each the server's memory, its
// deadlines, and a cancel and a resolution in the child's stop) and its
// lineage as many as its budget bought. Open leases are now bounded per
// holder and per lineage (--lease-max-open-per-holder,
// --lease-max-open-per-lineage): an offer or a reassignment past either is
// refused resource_exhausted, saying so, before the lease machine (no
// evidence row, no lease); a job that ends frees its place; the counts
// survive a restart. Seen failing before the change: the ninth offer to
// the holder was accepted.
func TestRogue21ALineageCannotMakeTheServerKeepUnboundedOpenLeases(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	bounds := func(cfg *controlplane.Config) {
		cfg.LeaseMaxOpenPerHolder = 8
		// The lineage's bound counts the leases each agent holds past its
		// own controlplane.LeaseReservePerNode (rogue24bound): with two
		// holders, 12 open in all.
		cfg.LeaseMaxOpenPerLineage = 12 - 2*controlplane.LeaseReservePerNode
	}
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), bounds)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	a := spawn(t, rogue, rogueNode.Node.NodeId, "a")
	b := spawn(t, rogue, rogueNode.Node.NodeId, "b")

	var held []*tetherv1.Lease
	for i := range 8 {
		l, err := offerTo(rogue, a.Node.NodeId, fmt.Sprintf("r21-a-%d", i))
		if err != nil {
			t.Fatalf("offer %d to the holder: %v", i, err)
		}
		held = append(held, l)
	}
	_, err := offerTo(rogue, a.Node.NodeId, "r21-a-8")
	refusedForTooMany(t, err, a.Node.NodeId)
	// Refused before the lease machine: no lease, no evidence row.
	if _, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "r21-a-8"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the refused job's lease: %v, want not_found", err)
	}
	if _, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: "r21-a-8"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the refused job's evidence: %v, want not_found (no row)", err)
	}

	// The lineage's bound: 8 + 4 open, then the next offer to another
	// member is refused too.
	var bHeld []*tetherv1.Lease
	for i := range 4 {
		l, err := offerTo(rogue, b.Node.NodeId, fmt.Sprintf("r21-b-%d", i))
		if err != nil {
			t.Fatalf("offer %d to the sibling: %v", i, err)
		}
		bHeld = append(bHeld, l)
	}
	_, err = offerTo(rogue, b.Node.NodeId, "r21-b-4")
	refusedForTooMany(t, err, "lineage")
	// Nor can a reassignment move a job to a full holder.
	_, err = rogue.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: bHeld[0].JobId, HolderIdentity: a.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)}))
	refusedForTooMany(t, err, a.Node.NodeId)

	// A job that ends frees its place: the holder completes one.
	holder := srv.Clients(a.Credential)
	l := held[0]
	if _, err := holder.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS})); err != nil {
		t.Fatal(err)
	}
	if _, err := offerTo(rogue, a.Node.NodeId, "r21-a-9"); err != nil {
		t.Fatalf("an offer after a job ended: %v, want it accepted", err)
	}
	_, err = offerTo(rogue, a.Node.NodeId, "r21-a-10")
	refusedForTooMany(t, err, a.Node.NodeId)

	// A restart counts the open leases again from the store.
	srv.Stop()
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk), bounds)
	rogue = srv.Clients(rogueNode.Credential)
	_, err = offerTo(rogue, a.Node.NodeId, "r21-a-11")
	refusedForTooMany(t, err, a.Node.NodeId)
	_, err = offerTo(rogue, b.Node.NodeId, "r21-b-5")
	refusedForTooMany(t, err, "lineage")
	// An operator resolving one of the sibling's jobs frees a place (of
	// the sibling's own share, now under it).
	if _, err := srv.AdminClients().Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: bHeld[1].JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "the operator gave up on it"})); err != nil {
		t.Fatal(err)
	}
	if _, err := offerTo(rogue, b.Node.NodeId, "r21-b-6"); err != nil {
		t.Fatalf("an offer to the sibling after one of its jobs was resolved: %v, want it accepted", err)
	}
}
