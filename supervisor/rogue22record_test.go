package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestTheRecordOfAOneChunkSubtreeIsOneCommit: the record was written in
// at least two transactions — its nodes chunk by chunk, then the calls
// with the header — so a termination whose subtree fits in one chunk
// committed its record twice, each a commit request to etcd. The last
// chunk of nodes now writes the calls and the header with it when the
// calls fit beside it: on real etcd a 10-agent subtree with three calls
// (one acknowledged, two closed unacknowledged) is recorded in one commit
// (two before), and the record still lists every node and every call
// once, the ledger closing the unacknowledged ones.
func TestTheRecordOfAOneChunkSubtreeIsOneCommit(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster)
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	recordChunks := 0
	var afterRevoke uint64 // the store's Updates when the revocation's last chunk committed
	s := &Supervisor{
		Store: st, Clock: clk,
		Tree: &tree.Tree{Store: st, Clock: clk, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 1000, MaxLabels: 4}},
		Log:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		ChunkFault: func(step string, _ int) {
			mu.Lock()
			defer mu.Unlock()
			switch step {
			case "record":
				recordChunks++
			case "revoke":
				afterRevoke = st.Stats().Updates
			}
		},
	}
	s.Ledger = &ledger.Ledger{Store: st, Clock: clk, AckWindow: CancelAckWindow}
	root, ids := buildTree(t, st, 10, 3)
	calls := map[string]string{} // node → call
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, nodeID := range []string{root, ids[4], ids[9]} {
			n, err := tree.GetNodeIn(tx, nodeID)
			if err != nil {
				return err
			}
			n.Holds |= tree.HoldsTracked | tree.HoldsCalls
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
			c := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: nodeID, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: clk.Now()}
			if err := ledger.PutCallIn(tx, c); err != nil {
				return err
			}
			if err := tx.Put(ledger.OpenCallKey(nodeID, c.CallID), nil); err != nil {
				return err
			}
			calls[nodeID] = c.CallID
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "one chunk", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	acked := false
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("the termination did not finish")
		}
		if _, err := s.Reconcile(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term, err = s.Get(ctx, term.ID); err != nil {
			t.Fatal(err)
		}
		if term.Phase == PhaseTerminated {
			break
		}
		if term.Phase == PhaseAborting && !acked {
			if _, err := s.Ledger.CancelAck(ctx, calls[ids[4]], "gate", "gate"); err != nil {
				t.Fatal(err)
			}
			acked = true
			continue
		}
		clk.Advance(time.Minute) // the other two are never acknowledged
	}
	rec := checkRecord(t, s, term, ids)
	commits := st.Stats().Updates - afterRevoke
	mu.Lock()
	defer mu.Unlock()
	if recordChunks != 1 || commits != 1 {
		t.Errorf("the record of a one-chunk subtree took %d transactions (%d etcd commits after the revocation), want 1", recordChunks, commits)
	}
	want := map[string]ledger.CallResolution{
		calls[root]:   ledger.CallResolutionCancelUnacknowledged,
		calls[ids[4]]: ledger.CallResolutionCancelledAcked,
		calls[ids[9]]: ledger.CallResolutionCancelUnacknowledged,
	}
	if len(rec.ToolCalls) != len(want) {
		t.Fatalf("the record lists %d calls, want %d", len(rec.ToolCalls), len(want))
	}
	for _, c := range rec.ToolCalls {
		if c.Resolution != want[c.CallID] {
			t.Errorf("the record lists call %s %q, want %q", c.CallID, c.Resolution, want[c.CallID])
		}
		stored, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, c.CallID) })
		if err != nil {
			t.Fatal(err)
		}
		if stored.Resolution != want[c.CallID] {
			t.Errorf("the ledger has call %s %q, the record %q", c.CallID, stored.Resolution, c.Resolution)
		}
	}
}

// TestCallsThatDoNotFitBesideTheLastChunkFollowInTheirOwn: the calls ride
// with the record's last chunk of nodes only when all of them fit beside
// it — at most a chunk of them, weighing at most a page. More calls than
// a chunk, or calls heavier than a page, are written in chunks of their
// own as before, the termination stopping after every chunk and a fresh
// supervisor taking it on (a restart); each call is in the record once,
// closed in the ledger.
func TestCallsThatDoNotFitBesideTheLastChunkFollowInTheirOwn(t *testing.T) {
	for _, tc := range []struct {
		name      string
		calls     int
		pageBytes int
		records   int // record transactions: 4 chunks of nodes, then the calls'
	}{
		{"fit", 5, 0, 4},
		{"more than a chunk", 15, 0, 4 + 2},
		{"heavier than a page", 5, 1000, 4 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 10)
			s.LeasePageBytes = tc.pageBytes
			_, all := buildTree(t, st, 30, 3)
			var callIDs []string
			if err := st.Update(ctx, func(tx store.Txn) error {
				for i := range tc.calls {
					nodeID := all[i]
					n, err := tree.GetNodeIn(tx, nodeID)
					if err != nil {
						return err
					}
					if n.Holds != 0 {
						// (A node stored before the notes, Holds 0, is
						// read whole: it keeps none.)
						n.Holds |= tree.HoldsCalls
						if err := tree.PutNodeIn(tx, n); err != nil {
							return err
						}
					}
					c := &ledger.ToolCall{CallID: id.New(id.Call), NodeID: nodeID, Tool: "shell", GateID: "gate", State: ledger.CallStateInFlight, BegunAt: s.Clock.Now()}
					if err := ledger.PutCallIn(tx, c); err != nil {
						return err
					}
					if err := tx.Put(ledger.OpenCallKey(nodeID, c.CallID), nil); err != nil {
						return err
					}
					callIDs = append(callIDs, c.CallID)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, CancelAckTimeout: time.Minute, Reason: "calls", RequestedBy: "operator:test"})
			if err != nil {
				t.Fatal(err)
			}
			clk := s.Clock.(*clock.Manual)
			records := 0
			for i := 0; term.Phase != PhaseTerminated; i++ {
				if i == 1000 {
					t.Fatal("the termination did not finish")
				}
				stepCtx, stop := context.WithCancel(ctx)
				chunked := false
				s.ChunkFault = func(step string, _ int) {
					chunked = true
					if step == "record" {
						records++
					}
					stop() // the process ends after the chunk's commit
				}
				_, err := s.Reconcile(stepCtx, term.ID)
				stop()
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				if term, err = s.Get(ctx, term.ID); err != nil {
					t.Fatal(err)
				}
				if !chunked {
					clk.Advance(time.Minute) // no call is ever acknowledged
				}
				// A restart: nothing kept in memory.
				s = &Supervisor{Store: st, Clock: s.Clock, Tree: s.Tree, ChunkSize: s.ChunkSize, LeasePageBytes: s.LeasePageBytes, Log: s.Log}
			}
			rec := checkRecord(t, s, term, all)
			if records != tc.records {
				t.Errorf("the record took %d transactions, want %d", records, tc.records)
			}
			seen := map[string]int{}
			for _, c := range rec.ToolCalls {
				seen[c.CallID]++
				if c.Resolution != ledger.CallResolutionCancelUnacknowledged {
					t.Errorf("the record lists call %s %q, want it closed unacknowledged", c.CallID, c.Resolution)
				}
			}
			for _, cid := range callIDs {
				if seen[cid] != 1 {
					t.Errorf("call %s is in the record %d times, want once", cid, seen[cid])
				}
				stored, err := store.Read(ctx, st, func(tx store.ReadTxn) (*ledger.ToolCall, error) { return ledger.GetCallIn(tx, cid) })
				if err != nil {
					t.Fatal(err)
				}
				if stored.Resolution != ledger.CallResolutionCancelUnacknowledged {
					t.Errorf("the ledger has call %s %q, want it closed unacknowledged", cid, stored.Resolution)
				}
			}
			if len(rec.ToolCalls) != len(callIDs) {
				t.Errorf("the record lists %d calls, want %d", len(rec.ToolCalls), len(callIDs))
			}
		})
	}
}
