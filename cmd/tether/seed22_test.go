package main

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestLeaseDecisionsNameTheirGeneration: `tether lease reassign`, `cancel`
// and `resolve` take --generation, the generation the operator decided
// about: a retried reassignment or a late resolution naming a generation
// since replaced is refused STALE_GENERATION and changes nothing; without
// the flag the decision is about the current generation, as before.
func TestLeaseDecisionsNameTheirGeneration(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	w := root.Msg.Node.NodeId
	tether(t, srv, srv.Admin, "lease", "offer", "job-g", "--holder", w, "--duration", "1m")
	if out := tether(t, srv, srv.Admin, "lease", "reassign", "job-g", "--holder", w, "--generation", "1"); !strings.Contains(out, "ACCEPTED REASSIGNED") {
		t.Fatalf("reassign --generation 1:\n%s", out)
	}
	for _, args := range [][]string{
		{"reassign", "job-g", "--holder", w, "--generation", "1"},
		{"resolve", "job-g", "--result", "failed", "--generation", "1"},
		{"cancel", "job-g", "--generation", "1"},
	} {
		if out := tether(t, srv, srv.Admin, append([]string{"lease"}, args...)...); !strings.Contains(out, "REJECTED STALE_GENERATION") {
			t.Fatalf("lease %s:\n%s", strings.Join(args, " "), out)
		}
	}
	l, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-g"}))
	if err != nil {
		t.Fatal(err)
	}
	if l.Msg.Lease.LeaseGeneration != 2 || l.Msg.Lease.State != tetherv1.LeaseState_LEASE_STATE_OFFERED || l.Msg.Lease.CancelRequested {
		t.Fatalf("after the stale decisions: generation %d %v cancel requested %v, want generation 2 OFFERED as it was", l.Msg.Lease.LeaseGeneration, l.Msg.Lease.State, l.Msg.Lease.CancelRequested)
	}
	if out := tether(t, srv, srv.Admin, "lease", "resolve", "job-g", "--result", "failed", "--generation", "2"); !strings.Contains(out, "ACCEPTED RESOLVED") {
		t.Fatalf("resolve --generation 2:\n%s", out)
	}
}
