package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// scanCounting counts the scans of a node's open-call keys.
type scanCounting struct {
	store.Txn
	scans *int
}

func (s scanCounting) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if bytes.HasPrefix(prefix, []byte(prefixOpenCall)) {
		*s.scans++
	}
	return s.Txn.Scan(prefix, start, fn)
}

// rogue36hNode begins and ends calls of one node as Begin and the ends
// (finish, the termination's closeUnacknowledged) write them.
type rogue36hNode struct {
	t     *testing.T
	st    store.Store
	node  string
	scans int
	open  map[string]string // call → gate
}

func newRogue36hNode(t *testing.T) *rogue36hNode {
	st, err := badgerstore.OpenBadger("", badgerstore.BadgerOptions{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &rogue36hNode{t: t, st: st, node: id.New(id.Node), open: map[string]string{}}
}

// begin begins a call through gate: Begin's bound and its open key.
func (r *rogue36hNode) begin(gate string) (string, error) {
	r.t.Helper()
	call := id.New(id.Call)
	err := r.st.Update(context.Background(), func(tx store.Txn) error {
		if err := openBelowLimit(scanCounting{tx, &r.scans}, r.node, gate, time.Time{}); err != nil {
			return err
		}
		return tx.Put(openCallKey(r.node, call), []byte(gate))
	})
	if err == nil {
		r.open[call] = gate
	}
	return call, err
}

func (r *rogue36hNode) end(call string) {
	r.t.Helper()
	if err := r.st.Update(context.Background(), func(tx store.Txn) error { return CloseOpenIn(tx, &ToolCall{NodeID: r.node, CallID: call}) }); err != nil {
		r.t.Fatal(err)
	}
	delete(r.open, call)
}

func (r *rogue36hNode) count() (uint64, bool) {
	r.t.Helper()
	var n uint64
	var ok bool
	if err := r.st.View(context.Background(), func(tx store.ReadTxn) error {
		var err error
		var c OpenCount
		c, ok, err = OpenCountIn(tx, r.node)
		n = c.Calls
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
	return n, ok
}

// TestRogue36HABeginReadsNoEndedCallsOfItsNode: a rogue churns calls on
// its node, each begun and ended; each later begin read every open-call
// key of the node, and the store's scan of them stepped over the deletion
// of every call ended since the last compaction, in the store's one
// writer (some 55 µs of a depth-1 tool call's ~500 µs of CPU after a few
// hundred calls a node, growing with the churn). The node's count of open
// calls answers instead: no begin reads its keys below the bound.
func TestRogue36HABeginReadsNoEndedCallsOfItsNode(t *testing.T) {
	r := newRogue36hNode(t)
	for range 500 {
		call, err := r.begin("gate-1")
		if err != nil {
			t.Fatal(err)
		}
		r.end(call)
	}
	if r.scans > 1 {
		t.Fatalf("500 begins of a churning node read its open-call keys %d times, want at most once (its first, with no count)", r.scans)
	}
	if n, ok := r.count(); !ok || n != 0 {
		t.Fatalf("after 500 calls ended the node counts %d open (counted %v), want 0", n, ok)
	}
}

// TestRogue36HTheOpenCallBoundIsExactWhateverTheOrder: seeded begins
// through two gates and ends in any order, calls open from before the
// count (an earlier version's keys, with and without their gate) among
// them: a begin is refused exactly when the node has
// MaxOpenCallsPerNode calls open through its gate, and the count is the
// node's open keys after every step.
func TestRogue36HTheOpenCallBoundIsExactWhateverTheOrder(t *testing.T) {
	for seed := range uint64(2) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(36, seed))
			r := newRogue36hNode(t)
			gates := []string{"gate-1", "gate-2"}
			// An earlier version's open calls: keys, no count.
			legacy := int(seed) * 100
			if err := r.st.Update(context.Background(), func(tx store.Txn) error {
				for i := range legacy {
					call, gate := id.New(id.Call), gates[i%2]
					value := []byte(gate)
					if i%5 == 0 {
						value, gate = nil, "" // from before the keys named their gate
					}
					r.open[call] = gate
					if err := tx.Put(openCallKey(r.node, call), value); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			refused := 0
			for step := range 900 {
				if len(r.open) > 0 && rng.IntN(6) == 0 {
					for call := range r.open {
						r.end(call)
						break
					}
				} else {
					gate := gates[rng.IntN(len(gates))]
					through := 0
					for _, g := range r.open {
						if g == gate {
							through++
						}
					}
					_, err := r.begin(gate)
					switch {
					case through >= MaxOpenCallsPerNode && !errors.Is(err, tree.ErrLimit):
						t.Fatalf("step %d: a begin through %s with %d open through it answered %v, want refused", step, gate, through, err)
					case through < MaxOpenCallsPerNode && err != nil:
						t.Fatalf("step %d: a begin through %s with %d open through it was refused: %v", step, gate, through, err)
					case err != nil:
						refused++
					}
				}
				if n, ok := r.count(); ok && n != uint64(len(r.open)) {
					t.Fatalf("step %d: the node counts %d open calls, it has %d", step, n, len(r.open))
				} else if !ok && step > 0 && legacy == 0 {
					t.Fatalf("step %d: no count", step)
				}
			}
			if refused == 0 {
				t.Fatal("no begin reached the bound: the test proves nothing about it")
			}
		})
	}
}
