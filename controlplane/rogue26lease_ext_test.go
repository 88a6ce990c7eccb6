package controlplane_test

import (
	"context"
	"fmt"
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

// onEachStoreLeading runs test on a Badger server, and on two replicas
// sharing one etcd keyspace once one of them serves the leases, all on
// clk. lead is the replica whose coordinator serves.
func onEachStoreLeading(t *testing.T, clk clock.Clock, test func(t *testing.T, replicas []*testserver.Server, lead *testserver.Server)) {
	t.Run("badger", func(t *testing.T) {
		srv := testserver.StartIn(t, t.TempDir(), testserver.WithClock(clk))
		test(t, []*testserver.Server{srv}, srv)
	})
	t.Run("etcd", func(t *testing.T) {
		cluster := etcdtest.Start(t)
		prefix := etcdtest.Prefix(t)
		var replicas []*testserver.Server
		for i := range 2 {
			st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
			replicas = append(replicas, testserver.Start(t, testserver.WithEtcdStore(st, fmt.Sprintf("replica-%d", i)), testserver.WithClock(clk)))
		}
		var lead *testserver.Server
		testserver.WaitFor(t, replicaWait, "a replica to serve the leases", func() bool {
			for _, r := range replicas {
				if serving, _ := r.Leases().Serving(); serving {
					lead = r
					return true
				}
			}
			return false
		})
		test(t, replicas, lead)
	})
}

// TestRogue26AReadPastTheDeadlineShowsWhatTheClockDecided: seed §5, §7,
// §10 and probe 2. A holder ACKs and then goes quiet — no renewal, no
// result; another offer is never ACKed. Once the coordinator's clock has
// passed the expiry and the ACK deadline, every read of the leases says
// so: GetLease (the operator's and the holder's, on the leader and on a
// follower), ListLeases and the evidence. Before, a read answered the
// lease as its last commit left it until the shard's deadline sweep (up
// to 100 ms of real time later, plus a commit) had recorded the expiry:
// the quiet holder's lease read ACTIVE, its authority window in the past,
// and the unACKed offer OFFERED with its ACK still PENDING — to a
// scheduler or an operator asking "who may run this job now", and to
// `tether lease show`.
func TestRogue26AReadPastTheDeadlineShowsWhatTheClockDecided(t *testing.T) {
	clk := clock.NewManual(epoch)
	onEachStoreLeading(t, clk, func(t *testing.T, replicas []*testserver.Server, lead *testserver.Server) {
		ctx := context.Background()
		admin := lead.AdminClients()
		root := register(t, admin, "planner")
		w1 := spawn(t, lead.Clients(root.Credential), root.Node.NodeId, "w1")
		holder := w1.Node.NodeId
		quiet, unacked := "r26-quiet-"+t.Name(), "r26-unacked-"+t.Name()
		offer := func(job string) *tetherv1.Lease {
			resp, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder,
				LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
			if err != nil {
				t.Fatalf("offer %s: %v", job, err)
			}
			return resp.Msg.Lease
		}
		l := offer(quiet)
		if _, err := lead.Clients(w1.Credential).Lease.Ack(ctx, connect.NewRequest(ack(l).GetAck())); err != nil {
			t.Fatal(err)
		}
		offer(unacked)
		clk.Advance(31 * time.Second) // past the expiry and the ACK deadline

		wantExpired := func(who string, got *tetherv1.Lease) {
			t.Helper()
			switch got.GetJobId() {
			case quiet:
				if got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || !got.LeaseExpired || got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
					t.Errorf("%s: the quiet holder's lease 1s past its expiry reads %s (lease_expired %v, expires %s, now %s); want EXPIRED",
						who, got.State, got.LeaseExpired, got.ExpiresAt.AsTime().Format(time.RFC3339), clk.Now().Format(time.RFC3339))
				}
			case unacked:
				if got.State != tetherv1.LeaseState_LEASE_STATE_EXPIRED || got.AckState != tetherv1.AckState_ACK_STATE_MISSED {
					t.Errorf("%s: the offer 21s past its ACK deadline reads %s, ACK %s; want EXPIRED, MISSED", who, got.State, got.AckState)
				}
			default:
				t.Errorf("%s: unexpected lease %v", who, got)
			}
		}
		// The followers first: the leader's reads settle what they read.
		order := append(followersOf(replicas, lead), lead)
		for i, r := range order {
			for who, c := range map[string]*testserver.Clients{"operator": r.AdminClients(), "holder": r.Clients(w1.Credential)} {
				for _, job := range []string{quiet, unacked} {
					resp, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
					if err != nil {
						t.Fatalf("replica %d, %s GetLease %s: %v", i, who, job, err)
					}
					wantExpired(fmt.Sprintf("replica %d, %s's GetLease", i, who), resp.Msg.Lease)
				}
				list, err := c.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: holder}))
				if err != nil {
					t.Fatalf("replica %d, %s ListLeases: %v", i, who, err)
				}
				for _, got := range list.Msg.Leases {
					wantExpired(fmt.Sprintf("replica %d, %s's ListLeases", i, who), got)
				}
			}
			ev, err := r.AdminClients().Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: quiet}))
			if err != nil {
				t.Fatal(err)
			}
			last := ev.Msg.Rows[len(ev.Msg.Rows)-1]
			if last.Decision.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED || !last.LeaseExpired {
				t.Errorf("replica %d: the quiet lease's last evidence row is %s %s (%s); want the expiry's",
					i, last.Message, last.Decision.GetAuditEvent(), last.Decision.GetReason())
			}
		}
		// Reading settled the expiry once: one row for it, however many read.
		ev, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: quiet}))
		if err != nil {
			t.Fatal(err)
		}
		expiries := 0
		for _, r := range ev.Msg.Rows {
			if r.Decision.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_LEASE_EXPIRED {
				expiries++
			}
		}
		if len(ev.Msg.Rows) != 3 || expiries != 1 {
			t.Errorf("the quiet lease's evidence: %d rows, %d of them the expiry; want offer, ack, one expiry", len(ev.Msg.Rows), expiries)
		}
	})
}

// TestRogue26ACancelledResultAcknowledgesTheCancelInAnyOrder: seed §9 and
// §15. After a cancel request the holder acknowledges it and reports
// CANCELLED; a reordering transport may deliver the result first. Arrival
// order is not authority, so the record ends the same either way: the
// cancel request, its acknowledgement by the holder, CANCELLED. Before,
// the reordered job's record read "Cancel Requested/ACK true / false"
// beside CANCELLED — the holder's acknowledgement, which it did send, was
// refused because the job had ended — while the same messages in order
// read "true / true".
func TestRogue26ACancelledResultAcknowledgesTheCancelInAnyOrder(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1 := via(w.w1C)
		end := func(reordered bool) (*tetherv1.Lease, *tetherv1.EvidenceRow) {
			job := w.job()
			l, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
			if _, err := w.plannerC.Lease.RequestCancel(context.Background(), connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"})); err != nil {
				t.Fatal(err)
			}
			msgs := []*tetherv1.ChannelRequest{cancelAck(l), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED)}
			if reordered {
				msgs[0], msgs[1] = msgs[1], msgs[0]
			}
			for _, m := range msgs {
				w1.send(t, m)
			}
			rows := w.evidence(t, job)
			return w.get(t, job), rows[len(rows)-1]
		}
		inOrder, inOrderRow := end(false)
		reordered, reorderedRow := end(true)
		for _, c := range []struct {
			name string
			l    *tetherv1.Lease
			row  *tetherv1.EvidenceRow
		}{{"in order", inOrder, inOrderRow}, {"reordered", reordered, reorderedRow}} {
			if c.l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED || !c.l.CancelRequested || !c.l.CancelAck {
				t.Errorf("%s: result %s, cancel requested %v, cancel ACK %v; want CANCELLED, true, true", c.name, c.l.TerminalResult, c.l.CancelRequested, c.l.CancelAck)
			}
			if !c.row.CancelRequested || !c.row.CancelAck {
				t.Errorf("%s: the last evidence row (%s %s) reads Cancel Requested/ACK %v / %v; want true / true",
					c.name, c.row.Message, c.row.Decision.GetAuditEvent(), c.row.CancelRequested, c.row.CancelAck)
			}
		}
		// The acknowledgement that arrives after the result repeats what
		// the result said: a DUPLICATE, nothing changed.
		if got := reorderedRow.Decision; got.GetOutcome() != tetherv1.Outcome_OUTCOME_DUPLICATE || got.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_CANCEL {
			t.Errorf("the cancel ACK after the CANCELLED result: %s %s (%s); want DUPLICATE DUPLICATE_CANCEL", got.GetOutcome(), got.GetAuditEvent(), got.GetReason())
		}
	})
}
