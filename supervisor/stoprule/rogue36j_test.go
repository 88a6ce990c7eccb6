package stoprule

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The thirty-sixth hostile pass, stop rules: a node's own open calls are
// read from its count of open calls (ledger.OpenCount), not from the
// listing of its open-call keys, which steps over the deleted key of
// every call the node ended until the store compacts them.

// ownReads counts what a read of the stop rules reads of one node's own
// open calls in the ledger: scans of its open-call keys, and call records.
type ownReads struct {
	store.Store
	node         string
	scans, calls *int
}

func (s ownReads) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(ownReadsTxn{tx, s}) })
}

type ownReadsTxn struct {
	store.ReadTxn
	s ownReads
}

func (t ownReadsTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	if bytes.Equal(prefix, ledger.OpenCallPrefix(t.s.node)) {
		*t.s.scans++
	}
	return t.ReadTxn.Scan(prefix, start, fn)
}

func (t ownReadsTxn) Get(key []byte) ([]byte, error) {
	if bytes.HasPrefix(key, []byte("calls/call/")) {
		*t.s.calls++
	}
	return t.ReadTxn.Get(key)
}

// beginOwn begins a call of n through gate as the ledger's Begin writes
// it: the bound, the count and the open key (ledger.OpenIn), the call's
// record, and the stop rules told of it.
func (g *rogue31cRig) beginOwn(n *tree.Node, gate string) *ledger.ToolCall {
	g.t.Helper()
	g.seq++
	c := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: n.NodeID, GateID: gate, Tool: "fetch", State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		if err := ledger.OpenIn(tx, c); err != nil {
			return err
		}
		if err := ledger.PutCallIn(tx, c); err != nil {
			return err
		}
		return g.rules.ObserveCall(tx, nil, c)
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

// beginOwnLegacy begins a call of n as a version without the count did:
// its open key and record, the count untouched.
func (g *rogue31cRig) beginOwnLegacy(n *tree.Node, gate string) *ledger.ToolCall {
	g.t.Helper()
	g.seq++
	c := &ledger.ToolCall{CallID: fmt.Sprintf("call-%d", g.seq), NodeID: n.NodeID, GateID: gate, Tool: "fetch", State: ledger.CallStateInFlight, BegunAt: g.clk.Now()}
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		if err := tx.Put(ledger.OpenCallKey(n.NodeID, c.CallID), []byte(gate)); err != nil {
			return err
		}
		if err := ledger.PutCallIn(tx, c); err != nil {
			return err
		}
		return g.rules.ObserveCall(tx, nil, c)
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

// endOwnLegacy ends c now as a version without the count did: its open
// key deleted, the count untouched.
func (g *rogue31cRig) endOwnLegacy(c *ledger.ToolCall) {
	g.t.Helper()
	ended := *c
	ended.State, ended.EndedAt, ended.Resolution = ledger.CallStateEnded, g.clk.Now(), ledger.CallResolutionCompleted
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		if err := g.rules.ObserveCall(tx, c, &ended); err != nil {
			return err
		}
		if err := tx.Delete(ledger.OpenCallKey(c.NodeID, c.CallID)); err != nil {
			return err
		}
		return ledger.PutCallIn(tx, &ended)
	})
	if err != nil {
		g.t.Fatal(err)
	}
}

// endOwn ends c now as the ledger's end (and the termination's close)
// write it: through ledger.CloseOpenIn.
func (g *rogue31cRig) endOwn(c *ledger.ToolCall) {
	g.t.Helper()
	ended := *c
	ended.State, ended.EndedAt, ended.Resolution = ledger.CallStateEnded, g.clk.Now(), ledger.CallResolutionCompleted
	err := g.st.Update(context.Background(), func(tx store.Txn) error {
		if err := g.rules.ObserveCall(tx, c, &ended); err != nil {
			return err
		}
		if err := ledger.CloseOpenIn(tx, c); err != nil {
			return err
		}
		return ledger.PutCallIn(tx, &ended)
	})
	if err != nil {
		g.t.Fatal(err)
	}
}

// judgeOwn judges expression on n through a Rules reading the same store,
// and says how many scans of n's open-call keys and call records it read.
func (g *rogue31cRig) judgeOwn(n *tree.Node, expression string) (res Result, scans, calls int) {
	g.t.Helper()
	r := &Rules{Store: ownReads{Store: g.st, node: n.NodeID, scans: &scans, calls: &calls}, Clock: g.clk}
	out, err := r.Test(context.Background(), Actor{ID: "agent:" + n.NodeID, NodeID: n.NodeID}, n.NodeID, expression, "")
	if err != nil {
		g.t.Fatal(err)
	}
	return out.Result, scans, calls
}

// TestRogue36JARogueChurningCallsBesideOneOpenIsJudgedWithoutItsEndedKeys:
// a rogue keeps one call open and churns 300 more (begun and ended, each
// ending leaving its open key's deletion in the store until a compaction).
// Each of twenty evaluations of its rule on call time (a tick each, as the
// evaluator judges a node with calls open) reads its count of open calls
// alone: no scan of its open-call keys, no call record, and the call's
// time exact. Before, every evaluation scanned the keys (stepping over the
// 300 deleted ones, uncharged) and read the call: 20 scans and 20 reads.
func TestRogue36JARogueChurningCallsBesideOneOpenIsJudgedWithoutItsEndedKeys(t *testing.T) {
	rogue36jChurn(t, newRogue31cRig(t))
}

// TestRogue36JARogueChurningCallsBesideOneOpenIsJudgedWithoutItsEndedKeysOnEtcd
// is the same on etcd.
func TestRogue36JARogueChurningCallsBesideOneOpenIsJudgedWithoutItsEndedKeysOnEtcd(t *testing.T) {
	rogue36jChurn(t, newRogue35kEtcdRig(t))
}

func rogue36jChurn(t *testing.T, g *rogue31cRig) {
	rogue := g.spawn(nil, "rogue")
	long := g.beginOwn(rogue, "gate")
	for range 300 {
		g.clk.Advance(time.Second)
		g.endOwn(g.beginOwn(rogue, "gate"))
	}
	open := g.clk.Now().Sub(long.BegunAt)
	scans, calls := 0, 0
	for tick := range 20 {
		g.clk.Advance(5 * time.Second)
		secs := (open + time.Duration(tick+1)*5*time.Second).Seconds()
		res, s, c := g.judgeOwn(rogue, fmt.Sprintf(`observed.call_seconds_max == %.1f && observed.call_seconds_total > %.1f && observed.calls_in_flight == 1`, secs, secs-0.5))
		if res.Err != nil || !res.Fired {
			t.Fatalf("tick %d: the long call open %.0f s read %v (%v); values %v", tick, secs, res.Fired, res.Err, res.Values)
		}
		scans, calls = scans+s, calls+c
	}
	if scans != 0 || calls != 0 {
		t.Errorf("20 evaluations of a rule on call time scanned the rogue's open-call keys %d times and read %d call records; want none (its count answers)", scans, calls)
	}
}

// TestRogue36JOwnCallTimeIsExactWhateverTheOrder: seeded begins and ends
// of one node's calls, two begun by a version without the count (before
// the node has one) and some ended by one (after: the count is not
// lowered, as on etcd during a rolling upgrade), a count written as the thirty-sixth
// pass's first version wrote it (no sum) among them: after every step a
// rule reads the node's own open calls exactly (how many, their time added
// up, the oldest, beside its ended calls' time), and the listing is read only when the count cannot
// answer (two calls open or more, a count without their begin times, or
// one that disagrees with calls_in_flight).
func TestRogue36JOwnCallTimeIsExactWhateverTheOrder(t *testing.T) {
	rogue36jExact(t, newRogue31cRig(t), 400)
}

// TestRogue36JOwnCallTimeIsExactWhateverTheOrderOnEtcd is the same on
// etcd, shorter.
func TestRogue36JOwnCallTimeIsExactWhateverTheOrderOnEtcd(t *testing.T) {
	rogue36jExact(t, newRogue35kEtcdRig(t), 120)
}

func rogue36jExact(t *testing.T, g *rogue31cRig, steps int) {
	rng := rand.New(rand.NewPCG(36, 10))
	rogue := g.spawn(nil, "rogue")
	var open []*ledger.ToolCall
	// Calls of the earlier version first: the node has no count.
	open = append(open, g.beginOwnLegacy(rogue, "gate"), g.beginOwnLegacy(rogue, "gate"))
	summedOnce, byCount, listed := false, 0, 0
	var endedTotal, endedMax uint64 // the ended calls' time, in ms
	for step := range steps {
		g.clk.Advance(time.Duration(1+rng.IntN(3000)) * time.Millisecond)
		switch p := rng.IntN(100); {
		case p < 4 && len(open) > 0:
			// Ended by a replica of an earlier version: the count not
			// lowered (the rule reads the listing from then on).
			i := rng.IntN(len(open))
			took := callMillis(g.clk.Now()) - callMillis(open[i].BegunAt)
			endedTotal, endedMax = endedTotal+took, max(endedMax, took)
			g.endOwnLegacy(open[i])
			open = slices.Delete(open, i, i+1)
		case p < 6:
			// The count as the thirty-sixth pass's first version wrote it
			// on a begin: how many, no sum.
			c := g.beginOwn(rogue, "gate")
			open = append(open, c)
			err := g.st.Update(context.Background(), func(tx store.Txn) error {
				return tx.Put(ledger.OpenCountKey(rogue.NodeID), binary.AppendUvarint(nil, uint64(len(open))))
			})
			if err != nil {
				t.Fatal(err)
			}
		case p < 50 && len(open) < 6:
			open = append(open, g.beginOwn(rogue, []string{"gate", "other"}[rng.IntN(2)]))
		case len(open) > 0:
			i := rng.IntN(len(open))
			took := callMillis(g.clk.Now()) - callMillis(open[i].BegunAt)
			endedTotal, endedMax = endedTotal+took, max(endedMax, took)
			g.endOwn(open[i])
			open = slices.Delete(open, i, i+1)
		}
		now := callMillis(g.clk.Now())
		total, oldest := endedTotal, endedMax
		for _, c := range open {
			ms := callMillis(c.BegunAt)
			total += now - ms
			oldest = max(oldest, now-ms)
		}
		res, scans, _ := g.judgeOwn(rogue, fmt.Sprintf(`observed.calls_in_flight == %d && observed.call_seconds_max > %g && observed.call_seconds_max < %g && observed.call_seconds_total > %g && observed.call_seconds_total < %g`,
			len(open), float64(oldest)/1e3-0.0005, float64(oldest)/1e3+0.0005, float64(total)/1e3-0.01, float64(total)/1e3+0.01))
		if res.Err != nil || !res.Fired {
			t.Fatalf("step %d: %d calls open, %d ms in all, the oldest %d ms: read %v (%v), values %v", step, len(open), total, oldest, res.Fired, res.Err, res.Values)
		}
		var n ledger.OpenCount
		var counted bool
		err := g.st.View(context.Background(), func(tx store.ReadTxn) error {
			var err error
			n, counted, err = ledger.OpenCountIn(tx, rogue.NodeID)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		answers := counted && n.Calls == uint64(len(open)) && (n.Calls == 0 || n.Calls == 1 && n.Summed)
		if answers {
			byCount++
		} else {
			listed++
		}
		if answers != (scans == 0) {
			t.Fatalf("step %d: %d calls open, count %+v (counted %v): the rule scanned the keys %d times", step, len(open), n, counted, scans)
		}
		if counted && n.Summed && n.Calls == uint64(len(open)) {
			summedOnce = true
			var sum uint64
			for _, c := range open {
				sum += callMillis(c.BegunAt)
			}
			if n.Calls != uint64(len(open)) || n.BegunMs != sum {
				t.Fatalf("step %d: count %+v, want %d calls begun at %d in all", step, n, len(open), sum)
			}
		}
	}
	if !summedOnce || byCount < steps/10 || listed < steps/10 {
		t.Fatalf("the count added up the begin times %v, answered %d steps, the listing %d: the seed tests too little", summedOnce, byCount, listed)
	}
}
