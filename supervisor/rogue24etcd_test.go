package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/tree"
)

// TestTheMarkReadsNoEndedCallListOfANodeWhoseCallsEndedOnNoStopsAccount:
// on etcd, the chunk that marks a root's 10 children reads, for each child
// with a call in flight, its list of open calls and the call itself, and
// not its list of calls that ended on a stop's account (calls/endedon/):
// no call of theirs ended on one (only a stop's mark, or a call ending
// under a requested stop, can give a node such calls, and either notes
// it on the node). Measured against the same chunk for 10 children with
// no call: 10 calls cost at most 20 ranges more, not 30.
func TestTheMarkReadsNoEndedCallListOfANodeWhoseCallsEndedOnNoStopsAccount(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx, tr, clk := context.Background(), s.Tree, s.Clock

	// The ranges the chunk after the roots' reads, for a root whose 10
	// children each have a call in flight (or none).
	kidsChunk := func(withCalls bool) (uint64, []string) {
		root, err := tr.RegisterRoot(ctx, "root", nil, "operator:test")
		if err != nil {
			t.Fatal(err)
		}
		specs := make([]tree.ChildSpec, 10)
		for i := range specs {
			specs[i] = tree.ChildSpec{Name: "agent"}
		}
		kids, err := tr.SpawnMany(ctx, root.NodeID, specs, "operator:test", nil)
		if err != nil {
			t.Fatal(err)
		}
		all := []string{root.NodeID}
		for _, k := range kids {
			all = append(all, k.NodeID)
			if withCalls {
				openCall(t, st, k.NodeID, clk.Now())
			}
		}
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: root.NodeID, Mode: ModeAbort, CancelAckTimeout: time.Minute, ConfirmTimeout: time.Minute, Reason: "ended-call lists", RequestedBy: "operator:test"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.mark(ctx, term.ID, clk.Now()); err != nil { // the roots' chunk
			t.Fatal(err)
		}
		before := st.Stats()
		if err := s.mark(ctx, term.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
		ranges := st.Stats().Ranges - before.Ranges
		if stored, err := s.Get(ctx, term.ID); err != nil || stored.Counts.Listed != len(all) {
			t.Fatalf("after the children's chunk: %+v, %v; want %d listed", stored.Counts, err, len(all))
		}
		term = reconcileAsTimePasses(t, s, term.ID)
		rec := checkRecord(t, s, term, all)
		if withCalls && len(rec.ToolCalls) != len(kids) {
			t.Errorf("the record lists %d calls, want the %d in flight", len(rec.ToolCalls), len(kids))
		}
		return ranges, all
	}
	without, _ := kidsChunk(false)
	with, _ := kidsChunk(true)
	if want := without + 2*10; with > want {
		t.Errorf("the children's chunk read %d ranges with a call in flight on each child, %d with none: want at most %d (each child's open calls and its call, no list of ended calls)", with, without, want)
	}
}
