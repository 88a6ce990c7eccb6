package coordinator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
)

// putBytesStore sums the bytes its Updates put.
type putBytesStore struct {
	store.Store
	mu    sync.Mutex
	bytes int
}

type putBytesTxn struct {
	store.Txn
	s *putBytesStore
}

func (t putBytesTxn) Put(k, v []byte) error {
	t.s.mu.Lock()
	t.s.bytes += len(k) + len(v)
	t.s.mu.Unlock()
	return t.Txn.Put(k, v)
}

func (s *putBytesStore) Update(ctx context.Context, fn func(store.Txn) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error { return fn(putBytesTxn{tx, s}) })
}

func (s *putBytesStore) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.bytes
	s.bytes = 0
	return n
}

// TestRogue30BARogueHoldersProgressCostsItsOwnSize: a reason quotes every
// text the sender chose (%q), four bytes for a control character. A rogue
// holder's 4 KiB progress value of control characters made a row of
// 20,677 bytes (the value, and the reason quoting it), one reusing the
// accepted sequence with another such value 32,976 (the reason quotes
// both), a late one 16,624, and a former holder's about as much, against
// 169 for a renewal: the rogue filled its shards' commits, which every
// other holder of jobs on those shards waits on (Config.MaxCommitBytes
// seals a batch at 128 KiB: four such rows). A row now carries each text
// the sender chose once, at its own size, and its reason reads back the
// same.
func TestRogue30BARogueHoldersProgressCostsItsOwnSize(t *testing.T) {
	st := &putBytesStore{Store: openStore(t, t.TempDir())}
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	h.active("job-1", "w1", time.Minute)
	h.active("job-2", "w1", time.Minute)
	h.want(lease.Reassign{JobID: "job-2", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: time.Minute, Reason: "drained"}, lease.OutcomeAccepted, lease.EventReassigned)
	st.take()
	ctl := func(last string) string { return strings.Repeat("\x01", lease.MaxValueBytes-1) + last }
	const bound = lease.MaxValueBytes + 512
	w1 := claim("job-1", "L-job-1", 1, "w1")
	for _, c := range []struct {
		what  string
		m     lease.Message
		event lease.AuditEvent
	}{
		{"accepted", lease.Progress{Claim: w1, ProgressSequence: 1, ProgressValue: ctl("a")}, lease.EventProgressRecorded},
		{"repeated", lease.Progress{Claim: w1, ProgressSequence: 1, ProgressValue: ctl("a")}, lease.EventDuplicateProgress},
		{"accepted seq reused with another value", lease.Progress{Claim: w1, ProgressSequence: 1, ProgressValue: ctl("b")}, lease.EventDuplicateProgress},
		{"accepted again", lease.Progress{Claim: w1, ProgressSequence: 3, ProgressValue: ctl("c")}, lease.EventProgressRecorded},
		{"late", lease.Progress{Claim: w1, ProgressSequence: 2, ProgressValue: ctl("d")}, lease.EventLateProgress},
		{"a former holder's", lease.Progress{Claim: claim("job-2", "L-job-2", 1, "w1"), ProgressSequence: 9, ProgressValue: ctl("e")}, lease.EventStaleGeneration},
		{"the detail of a result", lease.Complete{Claim: w1, Result: lease.ResultFailed, Detail: ctl("f")}, lease.EventTerminalAccepted},
	} {
		r := h.apply(c.m)
		if r.Decision.Event != c.event {
			t.Fatalf("%s: %s, want %s", c.what, r.Decision, c.event)
		}
		if n := st.take(); n > bound {
			t.Errorf("%s progress of %d control characters wrote %d bytes; want at most %d", c.what, lease.MaxValueBytes, n, bound)
		}
		rows, err := h.c.Evidence(context.Background(), c.m.Job())
		if err != nil {
			t.Fatal(err)
		}
		if got := rows[len(rows)-1].Decision; got.Outcome != r.Decision.Outcome || got.Event != r.Decision.Event || got.Reason != r.Decision.Reason {
			i := 0
			for i < min(len(got.Reason), len(r.Decision.Reason)) && got.Reason[i] == r.Decision.Reason[i] {
				i++
			}
			t.Fatalf("%s: the row's decision reads back %s %s, its reason from byte %d %.80q; want %s %s, %.80q", c.what, got.Outcome, got.Event, i, got.Reason[i:], r.Decision.Outcome, r.Decision.Event, r.Decision.Reason[i:])
		}
	}
	// Every 64th row of a job is an anchor, written whole: the rogue
	// times its value to land on one.
	h.active("job-3", "w1", time.Minute)
	w3 := claim("job-3", "L-job-3", 1, "w1")
	for seq := uint64(1); ; seq++ {
		rows, err := h.c.Evidence(context.Background(), "job-3")
		if err != nil {
			t.Fatal(err)
		}
		if rows[len(rows)-1].Number == 63 {
			break
		}
		h.want(lease.Renew{Claim: w3, RenewSequence: seq}, lease.OutcomeAccepted, lease.EventRenewed)
	}
	st.take()
	r := h.want(lease.Progress{Claim: w3, ProgressSequence: 1, ProgressValue: ctl("g")}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	if n := st.take(); n > bound {
		t.Errorf("progress of %d control characters in an anchor row wrote %d bytes; want at most %d", lease.MaxValueBytes, n, bound)
	}
	rows, err := h.c.Evidence(context.Background(), "job-3")
	if err != nil {
		t.Fatal(err)
	}
	if last := rows[len(rows)-1]; last.Number != 64 || last.Decision.Reason != r.Decision.Reason {
		t.Fatalf("row %d reads back %.100q, want row 64: %.100q", last.Number, last.Decision.Reason, r.Decision.Reason)
	}
	// And after a restart, from the store alone.
	before := h.get("job-1")
	h.stop()
	h = start(t, st, clk, lease.DefaultPolicy())
	if got := h.get("job-1"); got != before {
		t.Fatalf("after a restart:\n got %+v\nwant %+v", got, before)
	}
	if got, err := h.c.Evidence(context.Background(), "job-3"); err != nil || got[63].Decision.Reason != r.Decision.Reason {
		t.Fatalf("after a restart the anchor row reads back wrong (%v)", err)
	}
}
