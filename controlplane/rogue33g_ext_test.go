package controlplane_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue33GACallsEndReadsItsAncestorsTotalsWithTheCallOnEtcd: since
// the thirty-second pass a call's end adds its outcome and time to the
// subtree totals of each ancestor (stoprule, stoprules/sub/...), which the
// end's transaction read after the call, in turn: its node (for the
// ancestors), then the ancestors' records, each a read request of its own
// on etcd. A termination's cancel acknowledgements, one per call in
// flight, paid them all (supervisor/terminate-stores: 18 read requests
// while a 1,000-agent termination waited for its 100 acknowledgements,
// 230 after the pass). The end now fetches them with the call: an end of
// a call begun through this server is one read request, and so is an
// acknowledged cancel (its termination's deadline known here), on a node
// two levels deep; the cancel order read by the gate's watch no longer
// makes the server forget the ancestors the call's begin had read.
func TestRogue33GACallsEndReadsItsAncestorsTotalsWithTheCallOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd servers; make test and CI run them.")
	}
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	clk := clock.NewManual(epoch)
	var held atomic.Bool
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv := testserver.Start(t, testserver.WithEtcdStore(st, "replica-0"), testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationReconciled = func(string) {
			if held.Load() {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
			}
		}
	})
	var once sync.Once
	letGo := func() { once.Do(func() { held.Store(false); close(release) }) }
	t.Cleanup(letGo) // (before the server's stop, registered earlier)
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	mid := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "mid")
	leaf := spawn(t, srv.Clients(mid.Credential), mid.Node.NodeId, "leaf")
	grant := issueRoot(t, admin, leaf.Node.NodeId, time.Hour, "tool:*")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begin := func() string {
		t.Helper()
		resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: grant.token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Call.CallId
	}
	reads := func(what string, fn func() error) uint64 {
		t.Helper()
		before := st.Stats().ReadRequests
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n := st.Stats().ReadRequests - before
		t.Logf("%s: %d read requests", what, n)
		return n
	}
	end := func(call string) func() error {
		return func() error {
			_, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1"}))
			return err
		}
	}
	// The first end warms what is kept between calls (the gate's
	// credential, its rate budget); the second is measured.
	reads("the first call's end", end(begin()))
	if n := reads("a call's end", end(begin())); n > 1 {
		t.Errorf("a call's end two levels deep took %d read requests; want 1 (the call, its node and its ancestors' totals together)", n)
	}

	// Three calls in flight, their cancels ordered by an abort of the
	// leaf and read by the gate's watch. The first acknowledgement wakes
	// the reconciler, held as its next reconcile begins, so that the
	// second is counted alone.
	calls := []string{begin(), begin(), begin()}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	watch, err := gate.Tool.WatchCancels(wctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, leaf.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Minute, time.Hour, time.Hour)
	ordered := map[string]bool{}
	for len(ordered) < len(calls) && watch.Receive() {
		ordered[watch.Msg().GetCallId()] = true
	}
	if len(ordered) < len(calls) {
		t.Fatalf("the gate's watch ended with %d of %d cancel orders: %v", len(ordered), len(calls), watch.Err())
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	held.Store(true)
	ack := func(call string) func() error {
		return func() error {
			_, err := gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"}))
			return err
		}
	}
	reads("the first acknowledged cancel", ack(calls[0]))
	<-entered
	n := reads("an acknowledged cancel", ack(calls[1]))
	letGo()
	if n > 1 {
		t.Errorf("an acknowledged cancel two levels deep took %d read requests; want 1 (the call, its node and its ancestors' totals together)", n)
	}
}
