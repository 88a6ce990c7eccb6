package coordinator_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// A data directory written before the evidence log (a key per row) reads
// as before, and once the coordinator has gone on in the packed layout
// (the log, and packs under the job's prefix) the job's history is the
// old rows then the new ones: whole, page by page from every row and at
// every page size (so across every pack's boundary), and after a restart.
func TestEvidenceReadsTheOldLayoutAndThePackedOneTogether(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	defer st.Close()
	clk := clock.NewManual(t0)
	ctx := context.Background()
	progress := func(h *harness, job string, seq uint64) {
		t.Helper()
		clk.Advance(time.Millisecond)
		h.want(lease.Progress{Claim: claim(job, "L-"+job, 1, "w1"), ProgressSequence: seq, ProgressValue: fmt.Sprint(job, seq)}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	}
	evidence := func(h *harness, job string) []coordinator.Row {
		t.Helper()
		rows, err := h.c.Evidence(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			if r.Number != uint64(i+1) {
				t.Fatalf("row %d is numbered %d", i+1, r.Number)
			}
		}
		return rows
	}

	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("long", "w1", 10*time.Minute)
	h.active("other", "w1", 10*time.Minute)
	for seq := range uint64(100) {
		progress(h, "long", seq+1)
		progress(h, "other", seq+1)
	}
	old := evidence(h, "long")
	oldLease := h.get("long")
	h.stop()
	if err := coordinator.UnpackEvidence(st); err != nil {
		t.Fatal(err)
	}
	layout, err := coordinator.LayoutOf(st, "long")
	if err != nil || layout.Packs != 0 || layout.LogKeys != 0 || len(layout.Keys) != len(old) {
		t.Fatalf("the old layout: %+v, %v; want %d keys of a row each", layout, err, len(old))
	}

	h = start(t, st, clk, lease.DefaultPolicy())
	// A replica where no run serves reads the lease from the store: the
	// job's record, then its rows after it, wherever they are.
	follower, err := coordinator.New(ctx, coordinator.Config{Store: st, Clock: clk, Policy: lease.DefaultPolicy(), Log: quiet(), Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := evidence(h, "long"); !reflect.DeepEqual(got, old) {
		t.Fatalf("the old layout read back differs:\n got %+v\nwant %+v", got, old)
	}
	if got := h.get("long"); !reflect.DeepEqual(got, oldLease) {
		t.Fatalf("the lease read from the old layout: %+v, want %+v", got, oldLease)
	}
	for seq := range uint64(250) {
		progress(h, "long", 101+seq)
		if seq%3 == 0 {
			progress(h, "other", 101+seq)
		}
		if got, err := follower.Get(ctx, "long"); err != nil || !reflect.DeepEqual(got, h.get("long")) {
			t.Fatalf("after row %d the store's lease is %+v (%v), the run's %+v", 103+seq, got, err, h.get("long"))
		}
	}
	all := evidence(h, "long")
	if len(all) != len(old)+250 || !reflect.DeepEqual(all[:len(old)], old) {
		t.Fatalf("%d rows after the upgrade (want %d), the old ones changed: %v", len(all), len(old)+250, !reflect.DeepEqual(all[:len(old)], old))
	}
	layout, err = coordinator.LayoutOf(st, "long")
	if err != nil {
		t.Fatal(err)
	}
	adjacentPacks := 0
	for i := 1; i < len(layout.Keys); i++ {
		prev, k := layout.Keys[i-1], layout.Keys[i]
		if k[0] > prev[1]+1 {
			t.Fatalf("a gap between the keys %v and %v: %+v", prev, k, layout)
		}
		if prev[0] != prev[1] && k[0] != k[1] && k[0] == prev[1]+1 {
			adjacentPacks++
		}
	}
	for _, k := range layout.Keys {
		// A page decodes from the anchor before it (every 64th row) and
		// finds it by its key: no pack may hold an anchor after its first
		// row.
		if next := (k[0]/64 + 1) * 64; next <= k[1] {
			t.Fatalf("the pack of rows %d to %d holds anchor row %d", k[0], k[1], next)
		}
	}
	if layout.Packs < 3 || adjacentPacks < 2 || layout.LogRows == 0 {
		t.Fatalf("the new rows are not packed: %+v", layout)
	}

	checkPages := func(h *harness) {
		t.Helper()
		for after := 0; after <= len(all); after++ {
			for _, size := range []int{1, 2, 5, 64, 65} {
				page, err := h.c.EvidencePage(ctx, "long", coordinator.EvidenceCursor{After: uint64(after)}, size)
				if err != nil {
					t.Fatalf("page of %d after row %d: %v", size, after, err)
				}
				want := all[after:min(after+size, len(all))]
				if !reflect.DeepEqual(page.Rows, want) && !(len(want) == 0 && len(page.Rows) == 0) {
					t.Fatalf("page of %d after row %d: %d rows from %v, want %d from %v", size, after, len(page.Rows), first(page.Rows), len(want), first(want))
				}
				if more := after+size < len(all); page.More != more || (more && page.Next.After != uint64(after+size)) {
					t.Fatalf("page of %d after row %d: more %v next %+v", size, after, page.More, page.Next)
				}
			}
		}
	}
	checkPages(h)

	// A restart rebuilds the log from the store; the rows and the lease
	// read the same, and the job goes on.
	last := h.get("long")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	if got := h.get("long"); !reflect.DeepEqual(got, last) {
		t.Fatalf("after a restart: %+v, want %+v", got, last)
	}
	if got := evidence(h, "long"); !reflect.DeepEqual(got, all) {
		t.Fatal("after a restart the evidence differs")
	}
	checkPages(h)
	for seq := range uint64(40) {
		progress(h, "long", 351+seq)
	}
	if got := evidence(h, "long"); len(got) != len(all)+40 || !reflect.DeepEqual(got[:len(all)], all) {
		t.Fatalf("after a restart and 40 more rows: %d rows, want %d", len(got), len(all)+40)
	}
}

func first(rows []coordinator.Row) any {
	if len(rows) == 0 {
		return "nothing"
	}
	return rows[0].Number
}
