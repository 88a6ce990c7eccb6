package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// heldLeases is a lease module whose holders hold a fixed set of leases,
// finished or not: FinalizeHeldBy reports them (idempotent, as the
// coordinator's is), a page at a time in order of job id, and counts the
// leases it reported (read) and its calls.
type heldLeases struct {
	by          map[string][]RecordLease
	read, calls int
}

func (h *heldLeases) CancelHeldBy(context.Context, []string, string) error { return nil }

func (h *heldLeases) FinalizeHeldBy(_ context.Context, holders []string, _ string, page LeasePage) ([]RecordLease, bool, error) {
	var out []RecordLease
	for _, holder := range holders {
		for _, l := range h.by[holder] {
			if l.JobID > page.After {
				out = append(out, l)
			}
		}
	}
	slices.SortFunc(out, func(a, b RecordLease) int { return strings.Compare(a.JobID, b.JobID) })
	more := false
	if page.Limit > 0 && len(out) > page.Limit {
		out, more = out[:page.Limit], true
	}
	h.read += len(out)
	h.calls++
	return out, more, nil
}

// A node may hold any number of leases (an honest long-running worker's
// finished jobs, or a rogue's thousands), and its chunk of the record was
// one transaction with every one of them: past Badger's transaction limit
// (15% of the memtable, here 8 MiB) the chunk failed every time and the
// termination never reached TERMINATED. The chunk now writes a page of its
// members' leases and the rest follow in parts of their own, the cursor
// saying where; the termination stops after every chunk's commit and a
// fresh supervisor (a restart) takes it on from what is stored, and the
// record lists every lease exactly once and every node once.
func TestARecordWritesManyLeasesInPagesExactlyOnce(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{MemTableSize: 8 << 20}, 10)
	_, all := buildTree(t, st, 30, 3)
	const perHolder = 5000
	held := &heldLeases{by: map[string][]RecordLease{}}
	want := map[string]bool{}
	for _, holder := range []string{all[4], all[5], all[17]} {
		for i := range perHolder {
			l := RecordLease{
				JobID:   fmt.Sprintf("job-%s-%05d-%s", holder, i, strings.Repeat("x", 40)),
				LeaseID: fmt.Sprintf("lease-%05d", i), LeaseGeneration: 1, HolderIdentity: holder,
				Outcome: LeaseOutcomeCompleted, TerminalResult: LeaseResultSuccess,
			}
			held.by[holder] = append(held.by[holder], l)
			want[l.JobID+"/"+l.LeaseID] = true
		}
	}
	s.Leases = held
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	s, term, records := reconcileRestartingAfterEachChunk(t, ctx, s, term, func(s *Supervisor) { s.Leases = held })
	rec := checkRecord(t, s, term, all)
	seen := map[string]int{}
	for _, l := range rec.Leases {
		seen[l.JobID+"/"+l.LeaseID]++
	}
	for k := range want {
		if seen[k] != 1 {
			t.Fatalf("lease %s is in the record %d times, want once", k, seen[k])
		}
	}
	if len(rec.Leases) != len(want) {
		t.Fatalf("the record lists %d leases, the members held %d", len(rec.Leases), len(want))
	}
	// 31 nodes in chunks of 10, the last with the calls and the header: 4
	// record transactions without the leases; ~2.3 MiB of leases in pages
	// of at most 512 KiB take at least 4 more.
	if records < 4+4 {
		t.Errorf("the record took %d transactions, want at least 8 (its leases in pages)", records)
	}
	// Each page started reading after the last lease written: the leases
	// read grow with the leases (each about once, a fetch's worth again
	// per page where a page ended within it), not with leases times pages.
	// Seen failing before the change: every page re-listed its chunk's
	// leases (5,000 a holder), 50,000 read in all (15,976 after).
	t.Logf("%d leases read in %d calls for %d leases in %d record transactions", held.read, held.calls, len(want), records)
	if held.read > len(want)+records*leaseFetch {
		t.Errorf("the record read %d leases for %d, want each about once (at most %d)", held.read, len(want), len(want)+records*leaseFetch)
	}
}

// reconcileRestartingAfterEachChunk reconciles term until it is
// terminated, the process ending after every chunk's commit and starting
// again with nothing kept in memory (a Supervisor of s's store, clock,
// tree and chunk size, to which with gives its modules). It returns the
// last Supervisor, the termination and how many record chunks committed.
func reconcileRestartingAfterEachChunk(t *testing.T, ctx context.Context, s *Supervisor, term Termination, with func(*Supervisor)) (*Supervisor, Termination, int) {
	t.Helper()
	records := 0
	for range 1000 {
		stepCtx, stop := context.WithCancel(ctx)
		s.ChunkFault = func(step string, _ int) {
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
		if term.Phase == PhaseTerminated {
			return s, term, records
		}
		// A restart: nothing kept in memory.
		s = &Supervisor{Store: s.Store, Clock: s.Clock, Tree: s.Tree, ChunkSize: s.ChunkSize, Log: s.Log}
		with(s)
	}
	t.Fatalf("the termination is %s after 1,000 restarts, want terminated", term.Phase)
	return s, term, records
}
