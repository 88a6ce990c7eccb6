package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue26ASkewedReplicaClockCannotHideLifeAfterTheSessionsEnd: a bare
// claim of exit is confirmed by the control plane only when the session
// end it saw was the last it saw of the node (aab09e5), and on etcd the
// end and the heartbeats may be seen by different replicas
// (TestRogue26AHeartbeatOnAnotherReplicaStillOutlivesTheSessionsEnd).
// The rule compared the node's last_seen_at with its session_closed_at:
// two wall clocks when two replicas wrote them. The rogue picks the
// replicas: it ends its session on the one whose clock runs ahead and
// lives on, heartbeating, on the one whose clock runs behind (ten minutes
// here; the credentials the behind replica mints are good on both). Each
// heartbeat after the end was stamped earlier than the end — or not
// written at all, when a heartbeat on the replica ahead had stamped last
// seen later than the behind replica's now (the write is throttled on the
// stored time) — and the claim read CONFIRMED by the control plane. The
// order of what the control plane saw is now the store's, not the
// clocks', and a heartbeat after the session's end is always written.
func TestRogue26ASkewedReplicaClockCannotHideLifeAfterTheSessionsEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replicas; make test and CI run them.")
	}
	const skew = 10 * time.Minute
	ahead, behind, advance := skewedReplicas(t, skew)
	ctx := context.Background()
	lead := register(t, behind.AdminClients(), "lead")
	child := spawn(t, behind.Clients(lead.Credential), lead.Node.NodeId, "rogue")
	self := child.Node.NodeId

	// A heartbeat on the replica ahead, then the session there: opened
	// and closed at once.
	if _, err := ahead.Clients(child.Credential).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}
	sess, err := openSession(t, ahead.Clients(child.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	sess.close()
	admin := ahead.AdminClients()
	testserver.WaitFor(t, 20*time.Second, "the replica ahead to store the rogue's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})

	// Nine minutes alive after it, heartbeating on the replica behind.
	cred := child.Credential
	for range 9 {
		advance(time.Minute)
		hb, err := behind.Clients(cred).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self}))
		if err != nil {
			t.Fatal(err)
		}
		if c := hb.Msg.GetCredential().GetCredential(); c != "" {
			cred = c
		}
	}
	n := getNode(t, admin, self)
	if n.LastSeenAt == nil || n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime()) {
		t.Fatalf("last seen %v, session closed %v: the skew stamps the heartbeats no later than the end", n.LastSeenAt, n.SessionClosedAt)
	}

	// The stop (its deadlines on the replica ahead, so in the future on
	// both), the claim on the replica behind, then time past every
	// deadline on either clock, whichever replica reconciles.
	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	if _, err := behind.Clients(cred).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	advance(skew + 5*time.Minute)
	waitState(t, ahead, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	advance(skew + 5*time.Minute)
	waitState(t, ahead, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ConfirmedBy != "" || rn.ClaimedBy == "" {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted: the replica behind saw the rogue alive for nine minutes after its session ended on the replica ahead",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
	}
}

// TestRogue26AnEndOnTheReplicaBehindAfterAHeartbeatAheadIsConfirmed
// (guard): the honest order — a heartbeat, then the session's end, then
// the claim — confirmed by the control plane though the heartbeat was
// stamped by the replica ahead and the end, after it, by the replica
// behind, ten minutes earlier. By the times, the node was seen alive
// after its session ended and its claim was only a claim.
func TestRogue26AnEndOnTheReplicaBehindAfterAHeartbeatAheadIsConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replicas; make test and CI run them.")
	}
	ahead, behind, advance := skewedReplicas(t, 10*time.Minute)
	ctx := context.Background()
	admin := ahead.AdminClients()
	lead := register(t, behind.AdminClients(), "lead")
	child := spawn(t, behind.Clients(lead.Credential), lead.Node.NodeId, "worker")
	self := child.Node.NodeId
	sess, err := openSession(t, behind.Clients(child.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	advance(time.Minute)
	if _, err := ahead.Clients(child.Credential).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: self})); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	sess.close()
	testserver.WaitFor(t, 20*time.Second, "the replica behind to store the worker's session end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	if n := getNode(t, admin, self); !n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime()) {
		t.Fatalf("last seen %v, session closed %v: the skew stamps the heartbeat after the end", n.LastSeenAt, n.SessionClosedAt)
	}
	if _, err := behind.Clients(child.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	advance(15 * time.Minute)
	waitState(t, ahead, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	advance(15 * time.Minute)
	waitState(t, ahead, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || rn.ConfirmedBy != "control-plane" {
		t.Fatalf("record: %s confirmed by %q (reason %q), want confirmed by the control plane: its session's end was the last it saw of the worker", rn.Outcome, rn.ConfirmedBy, rn.UnaccountedReason)
	}
}

// skewedReplicas starts two control-plane replicas on one etcd, each with
// its own manual clock, the first's running skew ahead of the second's;
// advance moves both.
func skewedReplicas(t *testing.T, skew time.Duration) (ahead, behind *testserver.Server, advance func(time.Duration)) {
	t.Helper()
	clkAhead, clkBehind := clock.NewManual(epoch.Add(skew)), clock.NewManual(epoch)
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	var replicas []*testserver.Server
	// The replica behind first: the signing key it makes is active from
	// its clock's now, already past on the other's.
	for i, clk := range []*clock.Manual{clkBehind, clkAhead} {
		st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
		replicas = append(replicas, testserver.Start(t, testserver.WithEtcdStore(st, fmt.Sprintf("replica-%d", i)), testserver.WithClock(clk)))
	}
	return replicas[1], replicas[0], func(d time.Duration) { clkAhead.Advance(d); clkBehind.Advance(d) }
}
