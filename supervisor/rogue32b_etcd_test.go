package supervisor

import (
	"context"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue32BTheRecordReadsItsClaimersOpenCallsTogetherOnEtcd: a bare
// claim is not corroborated while a call of the node is still open at the
// record (TestRogue32BACallStillInFlightAtTheRecordIsNotAnExit), so the
// record's chunk reads the open calls of each member whose claim would
// otherwise stand, and the walk below each claiming parent reads its
// descendants' open calls (TestRogue32BAParentLivingOnThroughItsChildsCallIsNotConfirmed).
// One scan each, in turn, was a read request per node on etcd (111
// claimers: 260 read requests, the transaction running twice; 139 with
// the transaction's fetched together); they are fetched together, a page
// of nodes at a time: 40 — the walk's scan of each parent's children,
// their nodes and their open calls, three requests a parent, and the
// transaction's few.
func TestRogue32BTheRecordReadsItsClaimersOpenCallsTogetherOnEtcd(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx := context.Background()
	all := spawnTen(t, s.Tree)
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "record reads", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	term, p := stepUntil(t, s, term.ID, ActWriteRecord)
	// Every node claims its exit, its session ended before, and may have
	// held a call: each claim would be corroborated but for its calls.
	now := s.Clock.Now()
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, id := range all {
			n, err := tree.GetNodeIn(tx, id)
			if err != nil {
				return err
			}
			n.Holds = n.Holds.With(tree.HoldsCalls)
			n.SessionClosedAt, n.SessionClosedSeq = now, n.LastSeenSeq+1
			n.ExitConfirmations = []tree.ExitConfirmation{{By: "agent:" + id, Kind: tree.ConfirmedBySelf, At: now}}
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.nodes.forget(all)
	before := st.Stats()
	if err := s.writeRecord(ctx, term, p, now); err != nil {
		t.Fatal(err)
	}
	after := st.Stats()
	reads, attempts := after.ReadRequests-before.ReadRequests, after.Attempts-before.Attempts
	t.Logf("the record's chunk: %d read requests, %d ranges, %d attempts", reads, after.Ranges-before.Ranges, attempts)
	if term, err = s.Get(ctx, term.ID); err != nil || term.Phase != PhaseTerminated {
		t.Fatalf("after the record's one chunk: %v, %v; want terminated", term.Phase, err)
	}
	rec := checkRecord(t, s, term, all)
	confirmed := 0
	for _, n := range rec.Nodes {
		if n.Outcome == NodeOutcomeConfirmed {
			confirmed++
		}
	}
	if confirmed != len(all) {
		t.Fatalf("the record confirms %d of %d claims (no call open, nothing alive below)", confirmed, len(all))
	}
	if reads > 48 {
		t.Errorf("the record's chunk of %d claimers took %d read requests in %d attempts; want at most 48", len(all), reads, attempts)
	}
}
