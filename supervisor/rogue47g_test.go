package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue47GAnAcknowledgementReachesTheReconcilerAsItsCallAlone: on
// etcd, the termination reconciler watched every key of the ledger, so
// each cancel acknowledgement of a termination sent it four or five events
// (the call, its open index, its node's count of open calls where kept,
// its cancel order, the note of its end by node: 4 here), and the etcd
// member encoded and the process decoded each, though the reconciler
// moves on the call alone and dropped the others (a sixth of a
// 1,000-agent termination's watch events). It now watches the
// ledger's keys that may move a termination (ledger.TerminationPrefixes):
// the acknowledgement reaches it as its call's one event, and the
// termination still ends with the call acknowledged in its record.
func TestRogue47GAnAcknowledgementReachesTheReconcilerAsItsCallAlone(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, clk := context.Background(), s.Clock
	s.Ledger = &ledger.Ledger{Store: st, Clock: clk}
	all := spawnTen(t, s.Tree)
	node := all[len(all)-1]
	call := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: node, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: clk.Now()}
	if err := st.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, node)
		if err != nil {
			return err
		}
		n.Holds |= tree.HoldsTracked | tree.HoldsCalls
		if err := tree.PutNodeIn(tx, n); err != nil {
			return err
		}
		if err := ledger.PutCallIn(tx, call); err != nil {
			return err
		}
		return tx.Put(ledger.OpenCallKey(node, call.CallID), nil)
	}); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "acknowledged", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase != PhaseRequested {
			break
		}
		if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if term.Phase != PhaseAborting {
		t.Fatalf("after the mark the termination is %s, want aborting", term.Phase)
	}

	// The reconcile loop's watches, from here on; then the gate's
	// acknowledgement, then a key under each watched prefix, written
	// after it, which tells each watch has delivered the acknowledgement.
	prefixes := reconcilerWatches()
	watches := make([]store.Watcher, len(prefixes))
	for i, p := range prefixes {
		if watches[i], err = st.Watch(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Ledger.CancelAck(ctx, call.CallID, "gate", "gate"); err != nil {
		t.Fatal(err)
	}
	sentinel := func(p []byte) []byte { return append(append([]byte{}, p...), "zz-sentinel"...) }
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, p := range prefixes {
			if err := tx.Put(sentinel(p), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var delivered []string
	guard := time.NewTimer(time.Minute) // against a hang only
	defer guard.Stop()
	for i, w := range watches {
		for done := false; !done; {
			select {
			case batch, ok := <-w.Events():
				if !ok {
					t.Fatalf("the watch of %q ended", prefixes[i])
				}
				for _, ev := range batch {
					if string(ev.Key) == string(sentinel(prefixes[i])) {
						done = true
						continue
					}
					delivered = append(delivered, string(ev.Key))
				}
			case <-guard.C:
				t.Fatalf("the watch of %q did not deliver its sentinel", prefixes[i])
			}
		}
	}
	if len(delivered) != 1 || delivered[0] != string(ledger.CallKey(call.CallID)) {
		t.Errorf("the acknowledgement reached the reconciler's watches as %d events %q; want its call's one", len(delivered), delivered)
	}
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, p := range prefixes {
			if err := tx.Delete(sentinel(p)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
	c, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, call.CallID) })
	if err != nil {
		t.Fatal(err)
	}
	if c.Resolution != ledger.CallResolutionCancelledAcked {
		t.Errorf("the call is resolved %q, want %q", c.Resolution, ledger.CallResolutionCancelledAcked)
	}
}

// BenchmarkRogue47GAcknowledgementsThroughTheReconcilersWatches: on one
// local etcd member, acknowledgement-shaped commits (a call of a
// termination written ended, its open index and cancel order deleted, its
// node's count of open calls and the note of its end by node written), 32
// at a time, while the termination reconciler's watches take them and
// kick as the loop does (one termination unfinished, so each call is
// decoded): watch=ledger watches every key of the ledger, as before the
// forty-seventh pass; watch=termination-prefixes those that may move a
// termination (reconcilerWatches). It reports the events delivered, and
// the CPU of the process and of the etcd member, per acknowledgement.
func BenchmarkRogue47GAcknowledgementsThroughTheReconcilersWatches(b *testing.B) {
	cluster := etcdtest.Start(b)
	pid := cluster.Members[0].Pid()
	for _, bc := range []struct {
		name     string
		prefixes [][]byte
	}{
		{"watch=ledger", [][]byte{[]byte(ledger.Prefix), []byte(tree.NodePrefix), []byte(prefixTermination)}},
		{"watch=termination-prefixes", reconcilerWatches()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st := etcdtest.OpenStore(b, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(b) })
			var k terminationKicks
			k.reset([]terminationPlace{{ID: "term_bench", NodeID: "n_root"}})
			var kicks, events atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			sentinel := func(p []byte) string { return string(p) + "zz-sentinel" }
			got := make(chan struct{}, len(bc.prefixes))
			for _, p := range bc.prefixes {
				w, err := st.Watch(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for batch := range w.Events() {
						for _, ev := range batch {
							if string(ev.Key) == sentinel(p) {
								got <- struct{}{}
							} else {
								events.Add(1)
							}
						}
						k.changed(batch, func(string) { kicks.Add(1) }, func(string) {})
					}
				})
			}
			// flush returns once every watch has delivered what was
			// committed before it: a key under each prefix, written after,
			// once each watch took it.
			flush := func() {
				if err := st.Update(context.Background(), func(tx store.Txn) error {
					for _, p := range bc.prefixes {
						if err := tx.Put([]byte(sentinel(p)), nil); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				for range bc.prefixes {
					<-got
				}
			}
			// The open index and cancel order of each call, as the call's
			// begin and its termination's mark wrote them.
			for from := 0; from < b.N; from += 100 {
				if err := st.Update(ctx, func(tx store.Txn) error {
					for n := from + 1; n <= min(from+100, b.N); n++ {
						node, callID := fmt.Sprintf("n_bench%06d", n%1000), fmt.Sprintf("c_bench%09d", n)
						if err := tx.Put(ledger.OpenCallKey(node, callID), nil); err != nil {
							return err
						}
						if err := tx.Put(ledger.CancelKey("bench-gate", callID), nil); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			flush()
			events.Store(0)
			var seq atomic.Int64
			begun := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			ack := func() error {
				n := seq.Add(1)
				node, callID := fmt.Sprintf("n_bench%06d", n%1000), fmt.Sprintf("c_bench%09d", n)
				c := &ledger.ToolCall{CallID: callID, NodeID: node, Tool: "shell", GateID: "bench-gate", State: ledger.CallStateEnded,
					TerminationID: "term_bench", BegunAt: begun, EndedAt: begun.Add(time.Second), CancelAckedAt: begun.Add(time.Second),
					EndedBy: "bench-gate", AcknowledgedBy: "bench-gate", Resolution: ledger.CallResolutionCancelledAcked}
				return st.Update(ctx, func(tx store.Txn) error {
					if err := ledger.PutCallIn(tx, c); err != nil {
						return err
					}
					if err := tx.Delete(ledger.OpenCallKey(node, callID)); err != nil {
						return err
					}
					if err := tx.Put(ledger.OpenCountKey(node), []byte{0}); err != nil {
						return err
					}
					if err := tx.Delete(ledger.CancelKey("bench-gate", callID)); err != nil {
						return err
					}
					return tx.Put(ledger.EndedOnKey(node, callID), []byte("term_bench"))
				})
			}
			cpu0, member0 := benchProcessCPU(), benchMemberCPU(pid)
			b.SetParallelism(16) // 32 goroutines on 2 cores: the gate's 32 at a time
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := ack(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			flush()
			cpu1, member1 := benchProcessCPU(), benchMemberCPU(pid)
			cancel()
			wg.Wait()
			ops := float64(b.N)
			b.ReportMetric(float64(events.Load())/ops, "events/op")
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/ops, "process-cpu-µs/op")
			b.ReportMetric(float64((member1-member0).Microseconds())/ops, "member-cpu-µs/op")
		})
	}
}

func benchProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchMemberCPU(pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(string(f[11]), 10, 64)
	s, _ := strconv.ParseUint(string(f[12]), 10, 64)
	return time.Duration(u+s) * (time.Second / 100)
}

// TestRogue47GTheReconcilerWatchesEveryLedgerKeyThatKicks: a ledger key
// kicks a termination (terminationKicks.changed) exactly when it is under
// a prefix the reconcile loop watches (reconcilerWatches): what the
// forty-seventh pass stopped watching kicked nothing, and every key that
// kicks still arrives.
func TestRogue47GTheReconcilerWatchesEveryLedgerKeyThatKicks(t *testing.T) {
	var k terminationKicks
	k.reset([]terminationPlace{{ID: "far", NodeID: "y"}})
	k.place("far", []string{"x"})
	watched := func(key []byte) bool {
		for _, p := range reconcilerWatches() {
			if bytes.HasPrefix(key, p) {
				return true
			}
		}
		return false
	}
	call := callEvent(t, 1, ledger.ToolCall{CallID: "c1", NodeID: "o", TerminationID: "far"})
	for _, ev := range []store.Event{
		call,
		{Type: store.EventPut, Key: ledger.TermCallKey("far", "c1")},
		{Type: store.EventPut, Key: append(ledger.RefusedPrefix("far", "o"), "c1"...)},
		{Type: store.EventPut, Key: ledger.OpenCallKey("o", "c1")},
		{Type: store.EventDelete, Key: ledger.OpenCallKey("o", "c1")},
		{Type: store.EventPut, Key: ledger.OpenCountKey("o"), Value: []byte{1}},
		{Type: store.EventPut, Key: ledger.CancelKey("g", "c1")},
		{Type: store.EventDelete, Key: ledger.CancelKey("g", "c1")},
		{Type: store.EventPut, Key: ledger.EndedOnKey("o", "c1"), Value: []byte("far")},
		{Type: store.EventPut, Key: ledger.RefusedMoreKey("far", "o"), Value: []byte{3}},
	} {
		kicked := false
		k.changed([]store.Event{ev}, func(string) { kicked = true }, func(string) {})
		if w := watched(ev.Key); kicked != w {
			t.Errorf("%s: kicked %v, watched %v; want a key that kicks watched and one that does not left out", ev.Key, kicked, w)
		}
	}
}
