package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// heldLeases is a lease module whose holders hold a fixed set of leases,
// finished or not: FinalizeHeldBy reports them (idempotent, as the
// coordinator's is), in no particular order.
type heldLeases struct{ by map[string][]RecordLease }

func (h *heldLeases) CancelHeldBy(context.Context, []string, string) error { return nil }

func (h *heldLeases) FinalizeHeldBy(_ context.Context, holders []string, _ string) ([]RecordLease, error) {
	var out []RecordLease
	for i := len(holders) - 1; i >= 0; i-- {
		held := h.by[holders[i]]
		for j := len(held) - 1; j >= 0; j-- {
			out = append(out, held[j])
		}
	}
	return out, nil
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
			break
		}
		// A restart: nothing kept in memory.
		s = &Supervisor{Store: st, Clock: s.Clock, Tree: s.Tree, ChunkSize: s.ChunkSize, Leases: held, Log: s.Log}
	}
	if term.Phase != PhaseTerminated {
		t.Fatalf("the termination is %s, want terminated", term.Phase)
	}
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
	// 31 nodes in chunks of 10 and the calls with the header: 5 record
	// transactions without the leases; ~2.3 MiB of leases in pages of at
	// most 512 KiB take at least 4 more.
	if records < 5+4 {
		t.Errorf("the record took %d transactions, want at least 9 (its leases in pages)", records)
	}
}
