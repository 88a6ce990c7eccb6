package supervisor

import (
	"context"
	"testing"
	"time"
)

// stepUntil runs the termination's steps one at a time, as a pass of the
// reconciler does, moving the manual clock to each wait's end, until the
// next step is want (returned with the progress it was decided on).
func stepUntil(t *testing.T, s *Supervisor, id string, want Action) (Termination, Progress) {
	t.Helper()
	ctx, clk := context.Background(), s.Clock.(interface{ Set(time.Time) })
	for range 1000 {
		term, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.observe(ctx, term)
		if err != nil {
			t.Fatal(err)
		}
		now := s.Clock.Now()
		action, wake := Next(term, p, now)
		if action == want {
			return term, p
		}
		switch action {
		case ActWait:
			clk.Set(wake)
		case ActMark:
			err = s.mark(ctx, id, now)
		case ActEndDrain:
			err = s.advance(ctx, term, action, p, now)
		case ActEscalate, ActCancelCalls:
			err = s.cancelCalls(ctx, term, action, p, now)
		case ActRevoke:
			err = s.revoke(ctx, term, p, now)
		case ActWriteRecord:
			err = s.writeRecord(ctx, term, p, now)
		default:
			t.Fatalf("termination %s: next step %v before %v", id, action, want)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("termination %s never came to %v", id, want)
	return Termination{}, Progress{}
}

// TestTheRecordsChunkReadsWhatItsTerminationNamesInOneRequestOnEtcd: on
// etcd, the record's chunk of a 111-node subtree read in turn the
// termination, then its subtree index from the cursor, then the held
// index's privileges and its grants (one View), and, in its transaction,
// the termination again, then the record's key, the privileges again and
// the calls the termination accounts for: eight read requests one after
// the other, each a round trip that Badger does not pay. Everything but
// the termination is named by the termination the reconciler already
// holds (its id and cursor), so each transaction now asks for it with the
// termination, in one request at one revision (store.PrefetchReads); a
// read the stored termination then does not need is a range wasted, and
// what is read is checked at the commit as before. Every node is still
// recorded once.
func TestTheRecordsChunkReadsWhatItsTerminationNamesInOneRequestOnEtcd(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx := context.Background()
	all := spawnTen(t, s.Tree)
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "record reads", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	term, p := stepUntil(t, s, term.ID, ActWriteRecord)
	if !term.HeldIndexed {
		t.Fatalf("the termination has no held index: %+v", term)
	}
	before := st.Stats()
	if err := s.writeRecord(ctx, term, p, s.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	after := st.Stats()
	term, err = s.Get(ctx, term.ID)
	if err != nil || term.Phase != PhaseTerminated {
		t.Fatalf("after the record's one chunk: %v, %v; want terminated", term.Phase, err)
	}
	// The View's one request, the nodes the process does not keep (no
	// watch here: one prefetch), and the transaction's one request.
	reads, attempts := after.ReadRequests-before.ReadRequests, after.Attempts-before.Attempts
	t.Logf("the record's chunk: %d read requests, %d ranges, %d attempts", reads, after.Ranges-before.Ranges, attempts)
	if reads > 3 || attempts != 1 {
		t.Errorf("the record's chunk of 111 nodes took %d read requests in %d attempts; want at most 3 in one", reads, attempts)
	}
	checkRecord(t, s, term, all)
}

// TestTheMarksChunksReadWhatTheirTerminationNamesWithItOnEtcd: on etcd,
// the mark's first chunk (the roots') read the termination, then the
// roots' nodes and call lists, then their open calls, then each root's
// stop request, in turn (five read requests with the plan's); a later
// chunk's plan read the termination, then the subtree index from the
// cursor. The roots' chunk now asks for the roots' nodes, call lists and
// stop requests with its termination, as the plan read it; a later
// chunk's plan asks for the index with the termination, as the pass read
// it. Every node is still marked and recorded once.
func TestTheMarksChunksReadWhatTheirTerminationNamesWithItOnEtcd(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, clk := context.Background(), s.Clock
	all := spawnTen(t, s.Tree)
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "mark reads", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	before := st.Stats()
	if err := s.markWith(ctx, term.ID, &term, clk.Now()); err != nil { // the roots' chunk
		t.Fatal(err)
	}
	after := st.Stats()
	roots := after.ReadRequests - before.ReadRequests
	// The plan's termination, and the chunk's one request (the
	// termination, the root's node, its call lists and stop request).
	t.Logf("the roots' chunk: %d read requests, %d ranges", roots, after.Ranges-before.Ranges)
	if roots > 2 {
		t.Errorf("the roots' chunk took %d read requests; want 2", roots)
	}
	term, err = s.Get(ctx, term.ID)
	if err != nil {
		t.Fatal(err)
	}
	before = st.Stats()
	if err := s.markWith(ctx, term.ID, &term, clk.Now()); err != nil { // the other 110 nodes
		t.Fatal(err)
	}
	after = st.Stats()
	kids := after.ReadRequests - before.ReadRequests
	// The plan's one request (the termination and the index), the walk's
	// two levels, and the chunk's: the termination, the nodes (no watch
	// here: one prefetch).
	t.Logf("the kids' chunk: %d read requests, %d ranges", kids, after.Ranges-before.Ranges)
	if kids > 5 {
		t.Errorf("the kids' chunk took %d read requests; want at most 5", kids)
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
}

// TestTheRevocationsChunkReadsItsIndexWithItsTerminationOnEtcd: on etcd,
// a chunk of the revocation read the termination, then the subtree index
// from the cursor, in turn, before the grant store's reads. The index is
// now asked for with the termination, as the pass read it.
func TestTheRevocationsChunkReadsItsIndexWithItsTerminationOnEtcd(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx := context.Background()
	all := spawnTen(t, s.Tree)
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "revocation reads", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	term, p := stepUntil(t, s, term.ID, ActRevoke)
	before := st.Stats()
	if err := s.revoke(ctx, term, p, s.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	after := st.Stats()
	// The View's one request and the chunk's transaction's (no grant
	// store, no privileges here).
	reads := after.ReadRequests - before.ReadRequests
	t.Logf("the revocation's chunk: %d read requests, %d ranges", reads, after.Ranges-before.Ranges)
	if reads > 2 {
		t.Errorf("the revocation's chunk of 111 nodes took %d read requests; want 2", reads)
	}
	term = reconcileToEnd(t, s, term.ID)
	checkRecord(t, s, term, all)
}
