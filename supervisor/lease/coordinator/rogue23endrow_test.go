package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// TestRogue23AJobsEndIsFoundAfterItsUnresolvedResultWasMadeFinal: an
// UNRESOLVED lease as a finalisation returned it, made final before its
// ends are read (an operator's Resolve, or the clock closing it), with
// more than an anchor's worth of rows after (a holder repeating messages):
// the predicate "carries UNRESOLVED" is then true on a run of rows and
// false after it, and the anchor search landed past the run: the record
// lost who ended the job and when (found false; a whole read finds row 3
// of 134). The search now asks "any terminal result" of an UNRESOLVED lease
// (and "a final one" of the others), which no later row undoes.
func TestRogue23AJobsEndIsFoundAfterItsUnresolvedResultWasMadeFinal(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	job := "j"
	h.active(job, "w", 10*time.Minute)
	c := claim(job, "L-"+job, 1, "w")
	h.want(lease.Resolve{JobID: job, Result: lease.ResultUnresolved, Reason: "stopped"}, lease.OutcomeAccepted, lease.EventResolved)
	stale := h.get(job) // what FinalizeHeldByPage returned
	h.want(lease.Resolve{JobID: job, Result: lease.ResultFailed, Reason: "operator:ops: it failed"}, lease.OutcomeAccepted, lease.EventResolved)
	for range 130 {
		h.apply(lease.Renew{Claim: c, RenewSequence: 2})
	}
	rows, err := h.c.Evidence(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	want := -1
	for i, r := range rows {
		if r.TerminalResult == stale.TerminalResult {
			want = i
			break
		}
	}
	err = h.c.EndOfEach(context.Background(), []lease.Lease{stale}, func(l lease.Lease, end coordinator.Row, found bool) error {
		if want < 0 || !found || end.Number != rows[want].Number {
			t.Errorf("found %v row %d; the whole read finds row %d (of %d)", found, end.Number, rows[want].Number, len(rows))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// countingStore counts the reads of its Views.
type countingStore struct {
	store.Store
	scans, gets int
}

type countingTxn struct {
	store.ReadTxn
	s *countingStore
}

func (c countingTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	c.s.scans++
	return c.ReadTxn.Scan(prefix, start, fn)
}
func (c countingTxn) Get(k []byte) ([]byte, error) { c.s.gets++; return c.ReadTxn.Get(k) }

func (s *countingStore) View(ctx context.Context, fn func(store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(countingTxn{tx, s}) })
}

// TestRogue23AShortJobsEndIsOneRead: reads per short job (3 rows, no
// anchor): one range read each is what a whole read of the job cost; each
// is a round trip on etcd, one after another for every lease of a record.
// The anchor search read anchor 1, anchor 64 (none) and then the rows: 301
// scans for 100 jobs; the rows before the first anchor are read first now.
func TestRogue23AShortJobsEndIsOneRead(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	var ls []lease.Lease
	for i := range 100 {
		job := "j" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		h.active(job, "w", 10*time.Minute)
		h.want(lease.Complete{Claim: claim(job, "L-"+job, 1, "w"), Result: lease.ResultSuccess, Detail: "done"}, lease.OutcomeAccepted, lease.EventTerminalAccepted)
		ls = append(ls, h.get(job))
	}
	cs := &countingStore{Store: st}
	c2, err := coordinator.New(context.Background(), coordinator.Config{Store: cs, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	cs.scans, cs.gets = 0, 0
	if err := c2.EndOfEach(context.Background(), ls, func(l lease.Lease, end coordinator.Row, found bool) error {
		if !found {
			t.Errorf("%s: not found", l.JobID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("EndOfEach of %d short jobs: %d scans, %d gets", len(ls), cs.scans, cs.gets)
	if cs.scans > len(ls)+1 {
		t.Errorf("%d scans for %d jobs; a whole read of each took %d", cs.scans, len(ls), len(ls)+1)
	}
}
