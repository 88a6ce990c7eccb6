package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue30DAParentLivingOnItsChildsCredentialIsNotConfirmed: a rogue
// parent was issued its child's credential at the child's spawn. Stopped
// with its subtree, it ends its own session, claims its exit, and lives on
// as its child: the child's revocation feed, opened with the child's
// credential, stays open through the record. The record read the parent
// CONFIRMED by the control plane (its session ended, nothing of its own
// credential since) and put the life it saw on the child alone, whose
// credential the parent holds: the control plane cannot tell the child's
// activity from the parent's. A bare claim of a node's exit is now not
// corroborated while a session or stream of a child it spawned is open:
// the parent reads unaccounted, naming the child. Guard: with the child's
// feed closed before the claim, the parent's claim is corroborated as
// before.
func TestRogue30DAParentLivingOnItsChildsCredentialIsNotConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that start a server per case; make test and CI run them.")
	}
	for _, tc := range []struct {
		name       string
		feedOpen   bool
		wantParent tetherv1.NodeOutcome
	}{
		{"the child's feed held open through the record", true, tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED},
		{"the child's feed closed before the claim", false, tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			parent := register(t, admin, "rogue")
			self := parent.Node.NodeId
			child := spawn(t, srv.Clients(parent.Credential), self, "child")

			sess, err := openSession(t, srv.Clients(parent.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			// The rogue, with the credential it was given for its child.
			fctx, fcancel := context.WithCancel(ctx)
			defer fcancel()
			feed, err := srv.Clients(child.Credential).Capability.WatchRevocations(fctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			defer feed.Close()
			if !feed.Receive() {
				t.Fatalf("the child's feed: %v", feed.Err())
			}
			endSessionStored(t, admin, clk, sess, self)
			if !tc.feedOpen {
				fcancel()
				testserver.WaitFor(t, 20*time.Second, "the child's feed's end to be stored", func() bool {
					return len(getNode(t, admin, child.Node.NodeId).OpenSessions) == 0
				})
			}
			clk.Advance(time.Minute)
			term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
			if _, err := srv.Clients(parent.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rec := record(t, admin, term.TerminationId)
			rn := recordNode(t, rec, self)
			if rn.Outcome != tc.wantParent {
				t.Fatalf("record: the parent %s (confirmed by %q, claimed by %q, reason %q), want %s",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason, tc.wantParent)
			}
			if tc.feedOpen && (rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, child.Node.NodeId)) {
				t.Fatalf("record: the parent unaccounted for %q (claimed by %q), want its claim shown and the child %s named",
					rn.UnaccountedReason, rn.ClaimedBy, child.Node.NodeId)
			}
			if cn := recordNode(t, rec, child.Node.NodeId); tc.feedOpen && cn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
				t.Fatalf("record: the child %s, want unaccounted (its feed open)", cn.Outcome)
			}
		})
	}
}

// TestRogue30DBAReportAfterTheStopIsItsClaimWhateverTheRequestsReplicasClock:
// on etcd, whether a holder's report came under its stop compared the
// lease leader's judgement of the report with the time the termination
// was requested on the clock of the replica that took the request — which
// an agent stopping its own subtree chooses. A rogue parent asks the stop
// of its child on a replica whose clock runs ahead of the leader's (here
// a minute), and the child reports its job FAILED after the mark: the
// record listed the report as the holder's word before the stop, not its
// claim under stop. The report is now also weighed against when the
// termination marked its subtree (the phase after requested, on the
// reconciler's clock, the leader's): flagged. Guard: a report before the
// stop, on the leader's clock before the mark, is not flagged.
func TestRogue30DBAReportAfterTheStopIsItsClaimWhateverTheRequestsReplicasClock(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replicas and the real binary; make test and CI run them.")
	}
	ctx := context.Background()
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	// The leader's clock a minute behind the other replica's, and still
	// but for the test's moves.
	clk := clock.NewManual(time.Now().Add(-time.Minute))
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(st, "replica-a"), testserver.WithClock(clk))
	election := electionOf(t, cluster, prefix)
	testserver.WaitFor(t, replicaWait, "replica a to lead", func() bool {
		c, err := election.Current(ctx)
		return err == nil && c.Identity == "replica-a"
	})
	b := testserver.StartProcess(t, t.TempDir(), "--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","),
		"--etcd-prefix", prefix, "--election-ttl", "2s")
	admin := a.AdminClients()
	rogue := register(t, admin, "rogue")
	child := spawn(t, a.Clients(rogue.Credential), rogue.Node.NodeId, "worker")
	holder := unary{a.Clients(child.Credential)}
	jobs := map[string]*tetherv1.Lease{}
	for _, job := range []string{"reported-before-the-stop", "reported-under-the-stop"} {
		resp, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
		if err != nil {
			t.Fatalf("offer %s: %v", job, err)
		}
		l, dec := holder.send(t, ack(resp.Msg.Lease))
		wantDecision(t, "ack "+job, dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		jobs[job] = l
	}
	_, dec := holder.send(t, complete(jobs["reported-before-the-stop"], tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
	wantDecision(t, "the report before the stop", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	clk.Advance(time.Second)
	// The rogue asks its child's stop of the replica whose clock is ahead.
	resp, err := b.Clients(rogue.Credential).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "rogue",
		CancelAckTimeout: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	term := resp.Msg.Termination
	waitState(t, a, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	clk.Advance(time.Second)
	// Aborting: its cancel was asked at the mark; FAILED is its word.
	_, dec = holder.send(t, complete(jobs["reported-under-the-stop"], tetherv1.TerminalResult_TERMINAL_RESULT_FAILED))
	wantDecision(t, "the report under the stop", dec, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	clk.Advance(2 * time.Minute)
	waitState(t, a, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, a, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	got := map[string]string{}
	for _, l := range record(t, admin, term.TerminationId).Leases {
		got[l.JobId] = fmt.Sprintf("%s under_stop=%t", l.EndedBy, l.ClaimedUnderStop)
	}
	want := map[string]string{
		"reported-before-the-stop": "LEASE_ENDED_BY_HOLDER_REPORT under_stop=false",
		"reported-under-the-stop":  "LEASE_ENDED_BY_HOLDER_REPORT under_stop=true",
	}
	for job, wl := range want {
		if got[job] != wl {
			t.Errorf("record lease %s:\n got %s\nwant %s", job, got[job], wl)
		}
	}
}
