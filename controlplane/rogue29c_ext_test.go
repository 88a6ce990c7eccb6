package controlplane_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue29CAStreamTheControlPlaneNeverSawEndIsLife: a stream of the
// node's own credential that is not a session (its revocation feed) was
// weighed only by its end: the replica serving it noted the node seen
// alive when the stream ended after the session's end (tree.SeenAlive).
// Until that note was stored, the claim read as if the stream had never
// been open. The rogue opens its feed on one replica and its session on
// another, ends the session and claims its exit; the replica serving the
// feed is frozen (the note's moment after the claim, held open: the
// termination judges the claim in it) or killed (a crash runs no
// handler's end: the note is never written). Either way the termination
// read the claim CONFIRMED by the control plane while the rogue read on.
// The open stream is now stored on the node when it opens, and the
// termination sees it as life: unaccounted, "its revocation feed … is
// still open", until the stream's own end notes the node seen after its
// session (in the transaction that removes it).
func TestRogue29CAStreamTheControlPlaneNeverSawEndIsLife(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd replicas and the real binary; make test and CI run them.")
	}
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"the feed's replica frozen past the claim", syscall.SIGSTOP},
		{"the feed's replica killed", syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cluster := etcdtest.Start(t)
			prefix := etcdtest.Prefix(t)
			clk := clock.NewManual(time.Now())
			st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
			a := testserver.Start(t, testserver.WithEtcdStore(st, "replica-a"), testserver.WithClock(clk))
			election := electionOf(t, cluster, prefix)
			testserver.WaitFor(t, replicaWait, "replica a to lead", func() bool {
				c, err := election.Current(ctx)
				return err == nil && c.Identity == "replica-a"
			})
			b := testserver.StartProcess(t, t.TempDir(), "--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","),
				"--etcd-prefix", prefix, "--election-ttl", "2s")
			defer func() { _ = b.Signal(syscall.SIGCONT) }()
			admin := a.AdminClients()
			lead := register(t, admin, "lead")
			child := spawn(t, a.Clients(lead.Credential), lead.Node.NodeId, "rogue")
			self := child.Node.NodeId

			sess, err := openSession(t, a.Clients(child.Credential), self)
			if err != nil {
				t.Fatal(err)
			}
			fctx, fcancel := context.WithCancel(ctx)
			defer fcancel()
			feed, err := b.Clients(child.Credential).Capability.WatchRevocations(fctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			defer feed.Close()
			if !feed.Receive() {
				t.Fatalf("the rogue's feed on replica b: %v", feed.Err())
			}
			clk.Advance(time.Minute)
			sess.close()
			testserver.WaitFor(t, 20*time.Second, "replica a to store the session's end", func() bool {
				return getNode(t, admin, self).SessionClosedAt != nil
			})
			if err := b.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Minute)
			term := terminate(t, admin, lead.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
			if _, err := a.Clients(child.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
				t.Fatal(err)
			}
			waitState(t, a, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
			clk.Advance(2 * time.Minute)
			waitState(t, a, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
			rn := recordNode(t, record(t, admin, term.TerminationId), self)
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, "revocation feed") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted: the rogue's revocation feed on replica b was open past its session's end",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}

// TestRogue29CAFeedLostWithTheServersCrashIsLife: on Badger, a rogue ends
// its session and reads on through its revocation feed; the control plane
// is killed (kill -9: no handler's end runs) and restarted, and the rogue
// claims its exit. The feed's end was never noted, and the claim read
// CONFIRMED by the control plane on the session's end the rogue outlived.
// The feed was stored open on the node; the restart closes what the
// previous run served, the feed as the node seen alive until then, after
// the session's end: unaccounted.
func TestRogue29CAFeedLostWithTheServersCrashIsLife(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("runs the real binary")
	}
	ctx := context.Background()
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr)
	admin := proc.Clients(proc.Admin)
	root := register(t, admin, "rogue")
	self := root.Node.NodeId
	sess, err := openSession(t, proc.Clients(root.Credential), self)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	feed, err := proc.Clients(root.Credential).Capability.WatchRevocations(fctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Close()
	if !feed.Receive() {
		t.Fatalf("the rogue's feed: %v", feed.Err())
	}
	sess.close()
	testserver.WaitFor(t, 20*time.Second, "the control plane to store the session's end", func() bool {
		return getNode(t, admin, self).SessionClosedAt != nil
	})
	proc.Kill()
	proc = testserver.StartProcessOn(t, dir, addr)
	admin = proc.Clients(proc.Admin)
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, 2*time.Second)
	if _, err := proc.Clients(root.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the termination to end", func() bool {
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rn := recordNode(t, record(t, admin, term.TerminationId), self)
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || rn.ClaimedBy == "" || !strings.Contains(rn.UnaccountedReason, "after its session ended") {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted: the rogue's feed was open past its session's end until the crash",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
	}
}
