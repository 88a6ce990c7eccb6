package coordinator

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/lease"
)

func testRow(job string, n uint64, size int) logRow {
	b := append([]byte{evidenceSchemaDelta}, byte(n&0x7f))
	if n > 0x7f {
		b = append([]byte{evidenceSchemaDelta}, byte(n&0x7f|0x80), byte(n>>7))
	}
	return logRow{job: job, number: n, row: append(b, bytes.Repeat([]byte{'x'}, size)...)}
}

// A pack is read only as the key's job's rows: one under job a's key that
// names job b is corrupt, not b's evidence, and a log row must name its
// job.
func TestPackUnderAJobsKeyCannotCarryAnotherJobsRows(t *testing.T) {
	rows := []logRow{testRow("b", 1, 10)}
	named := encodePack(nil, rows, true)
	if err := decodePack(named, "a", func(logRow) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a pack under job a naming job b: %v", err)
	}
	unnamed := encodePack(nil, rows, false)
	if err := decodePack(unnamed, "", func(logRow) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a log row without a job: %v", err)
	}
	var got []logRow
	if err := decodePack(unnamed, "a", func(r logRow) error { got = append(got, r); return nil }); err != nil || len(got) != 1 || got[0].job != "a" || got[0].number != 1 {
		t.Fatalf("a pack of job a: %+v, %v", got, err)
	}
	for cut := 1; cut < len(named); cut++ {
		if err := decodePack(named[:cut], "", func(logRow) error { return nil }); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a pack cut at %d of %d bytes: %v", cut, len(named), err)
		}
	}
}

// A commit's log is cut into parts that fit the store; a fold is cut at
// every anchor; a commit that failed leaves no part behind once the next
// takes its sequence.
func TestLogPlanFitsTheStoreAndCutsAtAnchors(t *testing.T) {
	l := evidenceLog{pending: map[string][]logRow{}}
	var big []logRow
	for i := range 12 {
		big = append(big, testRow("big", uint64(i+1), 60<<10))
	}
	failed := l.plan(big, DefaultMaxCommitBytes)
	if len(failed.puts) < 3 {
		t.Fatalf("%d parts for 720 KB of rows", len(failed.puts))
	}
	for _, p := range failed.puts {
		if err := store.CheckValue(p.value); err != nil || len(p.value) > packBytes+(64<<10) {
			t.Fatalf("a log part of %d bytes: %v", len(p.value), err)
		}
	}
	l.failed(failed)
	retry := l.plan([]logRow{testRow("big", 1, 10)}, DefaultMaxCommitBytes)
	if len(retry.puts) != 1 || !bytes.Equal(retry.puts[0].key, logKey(1, 0)) || len(retry.deletes) != len(failed.puts)-1 {
		t.Fatalf("the retry writes %d keys and deletes %d, after a failure of %d parts", len(retry.puts), len(retry.deletes), len(failed.puts))
	}
	l.apply(retry)

	// Job "a" writes rows 2.. one per commit; when the first commit
	// leaves the window every row in it is folded, cut at row 64.
	n := uint64(1)
	for range logWindow + 60 {
		n++
		p := l.plan([]logRow{testRow("a", n, 10)}, DefaultMaxCommitBytes)
		for _, put := range p.puts {
			if !strings.HasPrefix(string(put.key), string(evidencePrefix("a"))) {
				continue
			}
			var first, last uint64
			if err := decodePack(put.value, "a", func(r logRow) error {
				if first == 0 {
					first = r.number
				}
				if last != 0 && r.number != last+1 {
					t.Fatalf("pack %s: row %d after %d", put.key, r.number, last)
				}
				last = r.number
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if next := (first/anchorEvery + 1) * anchorEvery; !bytes.Equal(put.key, evidenceKey("a", first)) || next <= last {
				t.Fatalf("pack %s holds rows %d to %d", put.key, first, last)
			}
		}
		l.apply(p)
	}
	if len(l.window) != logWindow || len(l.pending["a"]) == 0 || len(l.pending) != 1 {
		t.Fatalf("window of %d commits, pending %v", len(l.window), len(l.pending))
	}
}

// A binary from before the evidence log would load leases without the
// rows in the log. Every run leaves a marker where such a binary reads job
// records, which it refuses (an unknown schema: it fails to start rather
// than serve leases that lost acknowledged decisions); this binary skips
// it, and no job can take its key.
func TestTheLayoutMarkerStopsABinaryFromBeforeTheLog(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := New(context.Background(), Config{Store: st, Clock: clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), Policy: lease.DefaultPolicy(), Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { done <- c.Run(ctx) }()
		for serving, changed := c.Serving(); !serving; serving, changed = c.Serving() {
			select {
			case <-changed:
			case err := <-done:
				t.Fatalf("the run ended before it served: %v", err)
			}
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	stop := run()
	// Two markers: the evidence log's, and the node holdings' (a binary
	// with the log but from before the holdings skips only the first, so
	// it refuses the second).
	for _, key := range [][]byte{layoutKey, holdingsLayoutKey} {
		var marker []byte
		if err := st.View(context.Background(), func(tx store.ReadTxn) error {
			marker, err = tx.Get(key)
			return err
		}); err != nil {
			t.Fatalf("marker %q: %v", key, err)
		}
		if _, err := decodeRecord(marker); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("the marker %q reads as a lease record: %v", key, err)
		}
		reserved := key[len(prefixJob):]
		_, err = c.Apply(context.Background(), lease.Offer{JobID: string(reserved), LeaseID: "L", HolderIdentity: "w", LeaseDuration: time.Minute})
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("an offer of the marker %q's job id: %v", key, err)
		}
		if _, err := c.StoredLease(context.Background(), string(reserved)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the marker %q's job id read: %v", key, err)
		}
	}
	if bytes.Equal(holdingsLayoutKey, layoutKey) {
		t.Fatal("the holdings marker is the evidence log's: a binary with the log would skip it")
	}
	// A restart skips the marker.
	stop()
	run()()
}
