package main

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue31BEvidenceTableNamesALateMessagesSender: the evidence table's
// HOLDER column is the job's holder after each message, and only the
// reason says who sent a worker message (` from "<node>"`). The table
// shortened every reason to its first 100 bytes, so a rogue former holder
// that claimed a long lease id in its late renewals had its name cut from
// each of its rows: they read as the current holder's rejected renewals.
// Each row of a worker message names its sender however long the reason.
func TestRogue31BEvidenceTableNamesALateMessagesSender(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	spawnWorker := func(name string) *tetherv1.SpawnResponse {
		t.Helper()
		w, err := srv.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return w.Msg
	}
	w1, w2 := spawnWorker("w1"), spawnWorker("w2")
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "moved", HolderIdentity: w1.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	rogue := srv.Clients(w1.Credential)
	if _, err := rogue.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	moved, err := admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "moved", HolderIdentity: w2.Node.NodeId, Reason: "moved"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(w2.Credential).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: "moved", LeaseId: moved.Msg.Lease.LeaseId, LeaseGeneration: 2})); err != nil {
		t.Fatal(err)
	}
	// The stale generation is judged before the lease id, so any id will
	// do; a long one pushes the sender past the table's cut. A quoted
	// ` from "<w2>"` in it names nobody.
	long := strings.Repeat("L", 120) + ` from "` + w2.Node.NodeId + `"`
	for seq := uint64(1); seq <= 2; seq++ {
		if _, err := rogue.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: "moved", LeaseId: long, LeaseGeneration: 1, RenewSequence: seq})); err != nil {
			t.Fatalf("stale renew %d: %v", seq, err)
		}
	}
	out := tether(t, srv, srv.Admin, "lease", "evidence", "moved")
	var stale int
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "STALE_GENERATION") {
			continue
		}
		stale++
		if !strings.Contains(line, `from "`+w1.Node.NodeId+`"`) {
			t.Errorf("the row of %s's late renewal does not name it as the sender:\n%s", w1.Node.NodeId, line)
		}
		if strings.Contains(line, `from "`+w2.Node.NodeId+`"`) {
			t.Errorf("the row of %s's late renewal names %s as a sender:\n%s", w1.Node.NodeId, w2.Node.NodeId, line)
		}
	}
	if stale != 2 {
		t.Fatalf("the table shows %d stale renewals, want 2:\n%s", stale, out)
	}
}

// TestRogue31BEvidenceTableNamesWhoDecided: a coordinator's decision is
// signed with the principal that sent it, and only its reason says so
// (`(reason "agent:n_…: …")`), past the 100 bytes the table shows of it:
// the table listed every cancel request and resolution of a job without
// who made it, so an agent of the lineage that cancelled and resolved a
// job read, there, as the operator. Each row of a coordinator's decision
// names its signer however long the reason.
func TestRogue31BEvidenceTableNamesWhoDecided(t *testing.T) {
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
	offered, err := lead.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job", HolderIdentity: w.Msg.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(w.Msg.Credential).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: "job", LeaseId: offered.Msg.Lease.LeaseId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := lead.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job", Reason: "stop"})); err != nil {
		t.Fatal(err)
	}
	if _, err := lead.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: "job", Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "gave up"})); err != nil {
		t.Fatal(err)
	}
	out := tether(t, srv, srv.Admin, "lease", "evidence", "job")
	signer := "agent:" + root.Msg.Node.NodeId
	for _, kind := range []string{"request_cancel", "resolve"} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) < 2 || f[1] != kind {
				continue
			}
			found = true
			if !strings.Contains(line, signer) {
				t.Errorf("the %s row does not name %s, who decided it:\n%s", kind, signer, line)
			}
		}
		if !found {
			t.Fatalf("no %s row:\n%s", kind, out)
		}
	}
}
