package supervisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

func chunkTestSupervisor(t *testing.T, opts badgerstore.BadgerOptions, chunk int) (*Supervisor, store.Store) {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := badgerstore.OpenBadger(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tr := &tree.Tree{Store: st, Clock: clk, Limits: tree.Limits{MaxDepth: 8, MaxChildren: 100000, MaxLabels: 4}}
	return &Supervisor{Store: st, Clock: clk, Tree: tr, ChunkSize: chunk, Log: opts.Logger}, st
}

// buildTree writes a root and n descendants (fan-out wide, breadth first)
// in Updates of at most 1,000 nodes, as Spawn writes them, and returns the
// root and every node's id. Two nodes in three note what they hold, as
// Spawn's nodes do (a parent its children); every third is a node stored
// before the notes, which the mark must walk the same.
func buildTree(t *testing.T, st store.Store, n, fanout int) (string, []string) {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nodes := []*tree.Node{{NodeID: id.New(id.Node), Name: "root", State: tree.NodeStateRunning, CreatedAt: now, Holds: tree.HoldsTracked}}
	for i := 1; i <= n; i++ {
		parent := nodes[(i-1)/fanout]
		if parent.Holds != 0 {
			parent.Holds |= tree.HoldsChildren
		}
		var holds tree.Holdings
		if i%3 != 0 {
			holds = tree.HoldsTracked
		}
		nodes = append(nodes, &tree.Node{
			NodeID: id.New(id.Node), ParentNodeID: parent.NodeID, Ancestors: append(append([]string(nil), parent.Ancestors...), parent.NodeID),
			Name: fmt.Sprintf("agent-%d", i), State: tree.NodeStateRunning, CreatedAt: now, Holds: holds,
		})
	}
	children := map[string]uint64{}
	for from := 0; from < len(nodes); from += 1000 {
		part := nodes[from:min(from+1000, len(nodes))]
		if err := st.Update(ctx, func(tx store.Txn) error {
			for _, nd := range part {
				if err := tree.PutNodeIn(tx, nd); err != nil {
					return err
				}
				if nd.ParentNodeID == "" {
					continue
				}
				if err := tx.Put(tree.ChildKey(nd.ParentNodeID, nd.NodeID), nil); err != nil {
					return err
				}
				c := children[nd.ParentNodeID] + 1
				if err := tx.Put(tree.ChildCountKey(nd.ParentNodeID), binary.BigEndian.AppendUint64(nil, c)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, nd := range part {
			if nd.ParentNodeID != "" {
				children[nd.ParentNodeID]++
			}
		}
	}
	ids := make([]string, len(nodes))
	for i, nd := range nodes {
		ids[i] = nd.NodeID
	}
	return nodes[0].NodeID, ids
}

// reconcileToEnd runs the reconciler's passes until the termination is
// terminated, as Run would (each pass re-reads stored state).
func reconcileToEnd(t *testing.T, s *Supervisor, id string) Termination {
	t.Helper()
	return reconcileUntilTerminated(t, s, id, 100000, func() {})
}

// reconcileUntilTerminated runs up to passes of the reconciler until the
// termination is terminated, calling between after each pass that left it
// unfinished.
func reconcileUntilTerminated(t *testing.T, s *Supervisor, id string, passes int, between func()) Termination {
	t.Helper()
	ctx := context.Background()
	for range passes {
		if _, err := s.Reconcile(ctx, id); err != nil {
			t.Fatal(err)
		}
		term, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if term.Phase == PhaseTerminated {
			return term
		}
		between()
	}
	t.Fatalf("termination %s did not finish", id)
	return Termination{}
}

// checkRecord checks that the termination's record lists every node of
// want exactly once (and nothing else), and that each is terminated.
func checkRecord(t *testing.T, s *Supervisor, term Termination, want []string) *ReconciliationRecord {
	t.Helper()
	ctx := context.Background()
	rec, err := s.Record(ctx, "", term.ID)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, len(rec.Nodes))
	for _, n := range rec.Nodes {
		seen[n.NodeID]++
	}
	for _, w := range want {
		if seen[w] != 1 {
			t.Fatalf("node %s is in the record %d times, want once", w, seen[w])
		}
	}
	if len(rec.Nodes) != len(want) {
		t.Fatalf("the record lists %d nodes, the subtree has %d", len(rec.Nodes), len(want))
	}
	if rec.TerminationID != term.ID || rec.RecordID != term.RecordID || len(rec.Phases) == 0 {
		t.Fatalf("record header: termination %s record %s, %d phases", rec.TerminationID, rec.RecordID, len(rec.Phases))
	}
	if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		for _, w := range want {
			n, err := tree.GetNodeIn(tx, w)
			if err != nil {
				return err
			}
			if n.State != tree.NodeStateTerminated || n.TerminationID != term.ID {
				return fmt.Errorf("node %s is %s under %q", w, tree.StateName(n.State), n.TerminationID)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestATerminationLargerThanOneTransaction terminates a subtree whose mark
// alone does not fit in one store transaction (Badger with an 8 MiB
// memtable holds about 1.2 MB per transaction): the termination goes
// through in chunks, and its record lists every node exactly once.
//
// TETHER_TEST_TERMINATION_AGENTS sets the subtree's size (default 12,000)
// for a one-off run at scale; the test logs how long the termination took.
func TestATerminationLargerThanOneTransaction(t *testing.T) {
	agents := 12000
	if v := os.Getenv("TETHER_TEST_TERMINATION_AGENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TETHER_TEST_TERMINATION_AGENTS=%q: want a positive number", v)
		}
		agents = n
	}
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{MemTableSize: 8 << 20}, 0)
	root, all := buildTree(t, st, agents, 50)
	ctx := context.Background()
	// What a one-transaction mark would write, the nodes alone: too large.
	err := st.Update(ctx, func(tx store.Txn) error {
		return store.Prefetch(tx, store.KeysOf(all, tree.NodeKey), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = st.Update(ctx, func(tx store.Txn) error {
		for _, nid := range all {
			n, err := tree.GetNodeIn(tx, nid)
			if err != nil {
				return err
			}
			n.State, n.TerminationID = tree.NodeStateAborting, "term_x"
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("marking %d nodes in one transaction: %v, want ErrTooLarge (the subtree must not fit one transaction)", len(all), err)
	}
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, Reason: "too large for one transaction", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	term = reconcileToEnd(t, s, term.ID)
	t.Logf("%d agents terminated in %s (chunks of %d)", len(all), time.Since(began).Round(time.Millisecond), DefaultChunkSize)
	if term.Counts.Listed != len(all) || term.Counts.Members != len(all) || term.Progress.Unconfirmed != len(all) {
		t.Fatalf("counts %+v, unconfirmed %d; want %d members", term.Counts, term.Progress.Unconfirmed, len(all))
	}
	checkRecord(t, s, term, all)
	var parts int
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		v, err := tx.Get(recordKey(term.RecordID))
		fmt.Sscan(string(v), &parts)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if parts < agents/DefaultChunkSize {
		t.Fatalf("the record is stored in %d parts, want one per chunk at least (%d)", parts, agents/DefaultChunkSize)
	}
	// The subtree index is stored a pack per chunk of the mark (the roots'
	// chunk, then chunks of up to DefaultChunkSize nodes), not a key per
	// node.
	keys := 0
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		return tx.Scan(subtreePrefix(term.ID), nil, func(_, _ []byte) error { keys++; return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if want := 1 + (len(all)-1+DefaultChunkSize-1)/DefaultChunkSize; keys != want {
		t.Fatalf("the subtree index of %d nodes takes %d keys, want %d (a pack per chunk)", len(all), keys, want)
	}
}

// TestARogueSpawnerCannotOutrunAChunkedMark plays the agent that spawns as
// fast as it can under every node of its subtree while the subtree is
// marked a few nodes at a time: each spawn is refused — its parent is
// marked, or (since the twenty-fourth pass) a stop is requested on it or an
// ancestor and not yet marked there — and the record covers the subtree as
// it was; none escapes. (Before that pass a spawn under a node its chunk
// had not reached yet was admitted, and the test saw its child covered.)
func TestARogueSpawnerCannotOutrunAChunkedMark(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 2)
	root, all := buildTree(t, st, 20, 3)
	ctx := context.Background()
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, Reason: "rogue", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	spawned := map[string]bool{}
	parents := append([]string(nil), all...)
	refused, accepted := 0, 0
	spawnEverywhere := func() {
		mu.Lock()
		ps := append([]string(nil), parents...)
		mu.Unlock()
		for _, p := range ps {
			child, err := s.Tree.Spawn(ctx, p, "rogue", nil, "agent:rogue", nil)
			mu.Lock()
			switch {
			case errors.Is(err, tree.ErrParentNotRunning):
				refused++
			case err != nil:
				mu.Unlock()
				t.Errorf("spawn under %s: %v", p, err)
				return
			default:
				accepted++
				spawned[child.NodeID] = true
				if len(spawned) < 40 {
					parents = append(parents, child.NodeID) // and under the new ones
				}
			}
			mu.Unlock()
		}
	}
	// Deterministically: a spawn attempt under every node between chunks.
	for chunk := 0; ; chunk++ {
		spawnEverywhere()
		stored, err := s.Get(ctx, term.ID)
		if err != nil {
			t.Fatal(err)
		}
		if stored.Phase != PhaseRequested {
			break
		}
		if chunk > 1000 {
			t.Fatal("the mark does not end while agents spawn")
		}
		if err := s.mark(ctx, term.ID, s.Clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// And concurrently, while the rest runs (nothing is left to mark).
	done := make(chan struct{})
	go func() { defer close(done); spawnEverywhere() }()
	term = reconcileToEnd(t, s, term.ID)
	<-done
	if accepted != 0 || refused == 0 {
		t.Fatalf("%d spawns accepted, %d refused under a subtree whose stop was requested: want every one refused", accepted, refused)
	}
	want := append([]string(nil), all...)
	for c := range spawned {
		want = append(want, c)
	}
	checkRecord(t, s, term, want)
	// And the tree agrees: the subtree is exactly what the record lists.
	sub, err := s.Tree.Subtree(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(sub) != len(want) {
		t.Fatalf("the subtree has %d nodes, the record %d", len(sub), len(want))
	}
}

// TestALegacyTerminationIsIndexed: a termination stored before the
// subtree index (its members listed in the termination) is moved to the
// index and finishes with every member in its record once.
func TestALegacyTerminationIsIndexed(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 2)
	root, all := buildTree(t, st, 6, 2)
	ctx := context.Background()
	now := s.Clock.Now()
	legacy, err := NewTermination(id.New(id.Termination), root, ModeAbort, 0, 0, 0, "legacy", "operator:test", now)
	if err != nil {
		t.Fatal(err)
	}
	legacy.Indexed = false
	legacy.Members = all
	legacy, err = Advance(legacy, ActMark, Progress{Unconfirmed: len(all)}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx store.Txn) error {
		for _, m := range all {
			n, err := tree.GetNodeIn(tx, m)
			if err != nil {
				return err
			}
			n.State, n.TerminationID = tree.NodeStateAborting, legacy.ID
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
		}
		return kv.PutJSON(tx, terminationKey(legacy.ID), legacy)
	}); err != nil {
		t.Fatal(err)
	}
	term := reconcileToEnd(t, s, legacy.ID)
	if !term.Indexed || len(term.Members) != 0 || term.Counts.Members != len(all) {
		t.Fatalf("after the run: indexed=%v, %d members inline, counts %+v", term.Indexed, len(term.Members), term.Counts)
	}
	checkRecord(t, s, term, all)
}

// TestATakeOverAfterTheMarkIsSeenByTheStepsThatSkipTheNodes: the revocation
// and the record take a termination's members from its index without
// reading their nodes while no member has been taken over since the mark
// (MembersIntact). An operator's abort that takes part of an agent's
// drain over must end that: the drain's members are then read node by
// node again, and the nodes taken over are not among them.
func TestATakeOverAfterTheMarkIsSeenByTheStepsThatSkipTheNodes(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 4)
	root, all := buildTree(t, st, 30, 5)
	ctx := context.Background()
	drain, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeDrain, DrainWindow: time.Hour, Reason: "the agent's long drain", RequestedBy: "agent:n_parent"})
	if err != nil {
		t.Fatal(err)
	}
	for drain.Phase == PhaseRequested {
		if _, err := s.Reconcile(ctx, drain.ID); err != nil {
			t.Fatal(err)
		}
		if drain, err = s.Get(ctx, drain.ID); err != nil {
			t.Fatal(err)
		}
	}
	members := func() []string {
		t.Helper()
		ids, err := store.Read(ctx, st, func(tx store.ReadTxn) ([]string, error) {
			_, ids, err := ownedIn(tx, drain, 0, len(all))
			return ids, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if !drain.MembersIntact || len(members()) != len(all) {
		t.Fatalf("after the mark: intact=%v, %d members of %d", drain.MembersIntact, len(members()), len(all))
	}
	// all[1] is the root's first child: it and its subtree (6 nodes with
	// fan-out 5 and 30 agents: all[1], all[6..10]) go to the abort.
	abort, err := s.Terminate(ctx, TerminateRequest{NodeID: all[1], Mode: ModeAbort, Reason: "the operator's abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	reconcileToEnd(t, s, abort.ID)
	if drain, err = s.Get(ctx, drain.ID); err != nil {
		t.Fatal(err)
	}
	taken := map[string]bool{all[1]: true}
	for _, n := range all[6:11] {
		taken[n] = true
	}
	got := members()
	if drain.MembersIntact || len(got) != len(all)-len(taken) {
		t.Fatalf("after the take-over: intact=%v, %d members, want %d", drain.MembersIntact, len(got), len(all)-len(taken))
	}
	for _, m := range got {
		if taken[m] {
			t.Fatalf("node %s, taken over by the abort, is still listed as the drain's", m)
		}
	}
}

// TestTheSubtreeIndexReadsAcrossPacks reads an index whose first entries
// are stored one a key (as before the packs) and the rest in packs of at
// most three entries: every slice of it, from every entry and of every
// length, is the entries in order, none twice or missing; and the packs
// took a key each, not one per entry.
func TestTheSubtreeIndexReadsAcrossPacks(t *testing.T) {
	defer func(n int) { subtreePackEntries = n }(subtreePackEntries)
	subtreePackEntries = 3
	_, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 0)
	ctx := context.Background()
	term := &Termination{ID: "term_packs", Counts: Counts{Listed: 12}}
	var all []subtreeEntry
	for i := range term.Counts.Listed {
		all = append(all, subtreeEntry{Node: fmt.Sprintf("node_%02d", i), Reach: ReachMark})
	}
	all[6].Reach, all[6].Other = ReachLeave, "term_other"
	if err := st.Update(ctx, func(tx store.Txn) error {
		for i, e := range all[:5] {
			if err := kv.PutJSON(tx, subtreeKey(term.ID, i), e); err != nil {
				return err
			}
		}
		// Two chunks' worth of packs: 4 entries (a pack of 3, one of 1),
		// then 3 (one pack).
		if err := putSubtreeEntries(tx, term.ID, 5, all[5:9]); err != nil {
			return err
		}
		return putSubtreeEntries(tx, term.ID, 9, all[9:])
	}); err != nil {
		t.Fatal(err)
	}
	keys := 0
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		return tx.Scan(subtreePrefix(term.ID), nil, func(_, _ []byte) error { keys++; return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if keys != 5+3 {
		t.Fatalf("the index takes %d keys, want 8 (5 entries one a key, 7 in 3 packs)", keys)
	}
	for from := range len(all) + 1 {
		for limit := 1; limit <= len(all)+1; limit++ {
			got, err := store.Read(ctx, st, func(tx store.ReadTxn) ([]subtreeEntry, error) {
				return readEntries(tx, term, from, limit)
			})
			if err != nil {
				t.Fatalf("from %d limit %d: %v", from, limit, err)
			}
			want := all[from:min(len(all), from+limit)]
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("from %d limit %d: read %v, want %v", from, limit, got, want)
			}
		}
	}
}
