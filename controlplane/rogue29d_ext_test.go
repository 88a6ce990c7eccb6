package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue29DAFailedResultLeavesTheCancelAckToRecordInAnyOrder: seed §9
// and §15. A cancellation is a request, the holder's acknowledgement and a
// terminal reconciliation — CANCELLED, FAILED or a bounded UNRESOLVED. An
// honest holder whose job failed while a cancel was pending acknowledges
// the request and reports FAILED; a reordering transport may deliver the
// result first. Before, the reordered job's record read "Cancel
// Requested/ACK true / false" beside FAILED — the acknowledgement it did
// send refused because the job had ended — while the same messages in
// order read "true / true". Now the acknowledgement is recorded either
// way, at its own time, and the FAILED stands; its repeat is a DUPLICATE.
func TestRogue29DAFailedResultLeavesTheCancelAckToRecordInAnyOrder(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		end := func(reordered bool) (*tetherv1.Lease, []*tetherv1.EvidenceRow) {
			job := w.job()
			l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
			if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
				t.Fatal(err)
			}
			msgs := []*tetherv1.ChannelRequest{cancelAck(l), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)}
			if reordered {
				msgs[0], msgs[1] = msgs[1], msgs[0]
			}
			for _, m := range msgs {
				w1.send(t, m)
			}
			return w.get(t, job), w.evidence(t, job)
		}
		inOrder, inOrderRows := end(false)
		reordered, reorderedRows := end(true)
		for _, c := range []struct {
			name string
			l    *tetherv1.Lease
			rows []*tetherv1.EvidenceRow
		}{{"in order", inOrder, inOrderRows}, {"reordered", reordered, reorderedRows}} {
			if c.l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED || !c.l.CancelRequested || !c.l.CancelAck {
				t.Errorf("%s: result %s, cancel requested %v, cancel ACK %v; want FAILED, true, true", c.name, c.l.TerminalResult, c.l.CancelRequested, c.l.CancelAck)
			}
			last := c.rows[len(c.rows)-1]
			if !last.CancelRequested || !last.CancelAck || last.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
				t.Errorf("%s: the last evidence row (%s %s) reads Cancel Requested/ACK %v / %v, result %s; want true / true, FAILED",
					c.name, last.Message, last.Decision.GetAuditEvent(), last.CancelRequested, last.CancelAck, last.TerminalResult)
			}
		}
		// The acknowledgement after the result is the holder's own,
		// recorded at its own time after the result's.
		last := reorderedRows[len(reorderedRows)-1]
		if got := last.Decision; got.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED || got.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_ACKED {
			t.Errorf("the cancel ACK after the FAILED result: %s %s (%s); want ACCEPTED CANCEL_ACKED", got.GetOutcome(), got.GetAuditEvent(), got.GetReason())
		}
		if reordered.CancelAckedAt.AsTime().Before(reordered.TerminalAt.AsTime()) {
			t.Errorf("the acknowledgement after the result reads acknowledged at %s, before the result at %s", reordered.CancelAckedAt.AsTime(), reordered.TerminalAt.AsTime())
		}
		// Its repeat (the SDK retrying) is a DUPLICATE and changes nothing.
		again, d := w1.send(t, cancelAck(reordered))
		if d.GetOutcome() != tetherv1.Outcome_OUTCOME_DUPLICATE || d.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_CANCEL {
			t.Errorf("the repeated cancel ACK: %s %s (%s); want DUPLICATE DUPLICATE_CANCEL", d.GetOutcome(), d.GetAuditEvent(), d.GetReason())
		}
		if !again.CancelAckedAt.AsTime().Equal(reordered.CancelAckedAt.AsTime()) || again.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_FAILED {
			t.Errorf("the repeated cancel ACK changed the lease: acknowledged %s (was %s), result %s", again.CancelAckedAt.AsTime(), reordered.CancelAckedAt.AsTime(), again.TerminalResult)
		}
	})
}

// TestRogue29DBALeaderThatLosesItsLeadershipBeforeItsReadShowsWhatTheClockDecided:
// a lease read on etcd is served by the leader's coordinator, which
// settles the deadlines the clock has passed before it answers; whether
// the replica serves was taken before the read. A leader that lost its
// leadership between that check and its read read the lease from the
// store as the last term left it and answered it — a quiet holder's lease
// ACTIVE past an expiry no coordinator had decided yet, which a tool or a
// planner reading it takes for authority the holder no longer has. Here
// the leader's election key goes while its read waits in that window
// (another candidate, which serves nothing, then leads), the clock passes
// the expiry, and the read goes on: it must answer what a serving
// coordinator decided (EXPIRED, or ACTIVE with the restart's grace), or
// Unavailable while none serves — never the stored lease past its expiry.
func TestRogue29DBALeaderThatLosesItsLeadershipBeforeItsReadShowsWhatTheClockDecided(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replica tests; make test and CI run them.")
	}
	clk := clock.NewManual(epoch)
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	open := func() *etcdstore.Etcd {
		return etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	}
	ctx := context.Background()

	lead := testserver.Start(t, testserver.WithEtcdStore(open(), "replica-lead"), testserver.WithClock(clk))
	testserver.WaitFor(t, replicaWait, "the replica to lead and serve the leases", func() bool {
		serving, _ := lead.Leases().Serving()
		return serving
	})
	admin := lead.AdminClients()
	root := register(t, admin, "planner")
	w1 := spawn(t, lead.Clients(root.Credential), root.Node.NodeId, "w1")
	const job = "rogue29d-quiet"
	offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w1.Node.NodeId,
		LeaseDuration: durationpb.New(30 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lead.Clients(w1.Credential).Lease.Ack(ctx, connect.NewRequest(ack(offer.Msg.Lease).GetAck())); err != nil {
		t.Fatal(err)
	}

	// A candidate that serves nothing campaigns behind the leader.
	blocker := electionOf(t, cluster, prefix)
	blocker.Identity = "blocker"
	leading, letGo := make(chan struct{}), make(chan struct{})
	blockerCtx, stopBlocker := context.WithCancel(ctx)
	blocked := make(chan error, 1)
	go func() {
		blocked <- blocker.Lead(blockerCtx, func(ctx context.Context) error {
			close(leading)
			select {
			case <-letGo:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	t.Cleanup(func() { stopBlocker(); <-blocked })
	var keys *clientv3.GetResponse
	testserver.WaitFor(t, replicaWait, "the blocker to campaign", func() bool {
		keys, err = blocker.Client.Get(ctx, blocker.Prefix+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err == nil && len(keys.Kvs) == 2
	})

	held, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(controlplane.HoldLeaseReadsBeforeTheRead(held, release))
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	type answer struct {
		l   *tetherv1.Lease
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		resp, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
		if err != nil {
			answers <- answer{nil, err}
			return
		}
		answers <- answer{resp.Msg.GetLease(), nil}
	}()
	select {
	case <-held:
	case <-time.After(replicaWait):
		t.Fatal("the leader's read never reached its store read")
	}
	// The leader loses its leadership: its election key goes, the blocker
	// leads, and nobody serves the leases while the clock passes the expiry.
	if _, err := blocker.Client.Delete(ctx, string(keys.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leading:
	case <-time.After(replicaWait):
		t.Fatal("the blocker never led")
	}
	testserver.WaitFor(t, replicaWait, "the deposed leader to stop serving", func() bool {
		serving, _ := lead.Leases().Serving()
		return !serving
	})
	clk.Advance(31 * time.Second)
	released = true
	close(release)

	var got answer
	select {
	case got = <-answers:
	case <-time.After(replicaWait):
		t.Fatal("the read never answered")
	}
	close(letGo) // the old leader may lead again
	if got.err == nil {
		t.Logf("the read answered %s, expires %s, at %s", got.l.State, got.l.ExpiresAt.AsTime().Format(time.RFC3339), clk.Now().Format(time.RFC3339))
	} else {
		t.Logf("the read answered %v", got.err)
	}
	switch {
	case got.err != nil:
		if connect.CodeOf(got.err) != connect.CodeUnavailable {
			t.Fatalf("the read while no replica serves: %v; want the lease as a serving coordinator decided it, or unavailable", got.err)
		}
	case got.l.State == tetherv1.LeaseState_LEASE_STATE_ACTIVE && !clk.Now().Before(got.l.ExpiresAt.AsTime()):
		t.Fatalf("the quiet holder's lease 1s past its expiry reads %s, expires %s, now %s, from a leader deposed before its read; want what a serving coordinator decided (EXPIRED, or ACTIVE with the restart's grace) or unavailable",
			got.l.State, got.l.ExpiresAt.AsTime().Format(time.RFC3339), clk.Now().Format(time.RFC3339))
	}
}
