package grantstore

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// Revoking a grant writes the same few keys whether it has one descendant
// or hundreds: the grant, one tombstone, the feed head and one marking job.
func TestRevokeWritesOneTombstoneWhateverTheSubtreeSize(t *testing.T) {
	w := newWorld(t, 0)
	nodes := w.chainOfNodes(3)
	small := w.bulkTree(nodes[:2], 1) // a root and one child
	large := w.bulkTree(nodes, 20)    // a root, 20 children, 400 grandchildren
	leaf := large[len(large)-1]
	counting := &faultyStore{Store: w.st, allow: 1 << 30}
	svc := w.service(counting)

	var writes []int64
	for _, tree := range [][]capability.Grant{small, large} {
		counting.maxWrites.Store(0)
		res, err := svc.Revoke(context.Background(), security, Target{GrantID: tree[0].GrantID}, "compromised")
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GrantIDs) != 1 || res.GrantIDs[0] != tree[0].GrantID {
			t.Fatalf("revoked %v, want only the root %s", res.GrantIDs, tree[0].GrantID)
		}
		writes = append(writes, counting.maxWrites.Load())
	}
	if writes[0] != 4 || writes[1] != 4 {
		t.Fatalf("a revocation wrote %v keys for subtrees of 1 and 420 grants; want 4 each (grant, tombstone, head, job)", writes)
	}
	if n := w.count(prefixTombstone); n != 2 {
		t.Fatalf("%d tombstones for two revocations", n)
	}
	// Not yet marked, but every read already says revoked, via the root.
	if got := w.stored(leaf.GrantID); got.State != capability.StateActive {
		t.Fatalf("the leaf was marked in the request path: %v", got.State)
	}
	if got := w.get(leaf.GrantID); got.State != capability.StateRevoked || got.RevokedVia != large[0].GrantID {
		t.Fatalf("Get(leaf) = %v via %q, want revoked via %s", got.State, got.RevokedVia, large[0].GrantID)
	}
	if _, err := w.svc.Refresh(context.Background(), operator, leaf.GrantID); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("refreshing a grant under a revoked root: %v", err)
	}

	marked, err := w.svc.MarkPending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if marked != 421 {
		t.Fatalf("marked %d grants, want 421", marked)
	}
	if n := w.count(prefixMark); n != 0 {
		t.Fatalf("%d marking jobs left", n)
	}
	got := w.stored(leaf.GrantID)
	if got.State != capability.StateRevoked || got.RevokedVia != large[0].GrantID || !got.RevokedAt.Equal(w.stored(large[0].GrantID).RevokedAt) {
		t.Fatalf("stored leaf after marking: %+v", got)
	}
	// A grant with nothing below it gets no marking job.
	single := w.bulkTree(nodes[:1], 0)
	w.revoke(security, single[0].GrantID)
	if n := w.count(prefixMark); n != 0 {
		t.Fatalf("revoking a grant without descendants left %d marking jobs", n)
	}
}

// The marker dies between batches; a restarted control plane finishes the
// job from its stored cursor, and no batch writes more than MarkBatch
// grants.
func TestMarkerResumesAfterACrash(t *testing.T) {
	const batch = 7
	w := newWorld(t, batch)
	nodes := w.chainOfNodes(3)
	tree := w.bulkTree(nodes, 5) // 1 + 5 + 25 grants
	w.revoke(security, tree[0].GrantID)

	crashing := &faultyStore{Store: w.st, allow: 2}
	n, err := w.service(crashing).MarkPending(context.Background())
	if !errors.Is(err, errInjected) {
		t.Fatalf("MarkPending through a crashing store: %v", err)
	}
	if n != 2*batch {
		t.Fatalf("marked %d before the crash, want %d", n, 2*batch)
	}
	if got := crashing.maxWrites.Load(); got > batch+1 {
		t.Fatalf("one marking transaction wrote %d keys, more than MarkBatch+1", got)
	}
	markedBefore := 0
	for _, g := range tree[1:] {
		if w.stored(g.GrantID).State == capability.StateRevoked {
			markedBefore++
		}
	}
	if markedBefore != 2*batch {
		t.Fatalf("%d grants are marked in the store, want the %d of the two committed batches", markedBefore, 2*batch)
	}
	if w.count(prefixMark) != 1 {
		t.Fatal("the marking job did not survive the crash")
	}

	w.restart()
	n, err = w.svc.MarkPending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != len(tree)-1-2*batch {
		t.Fatalf("the restarted marker marked %d, want the remaining %d", n, len(tree)-1-2*batch)
	}
	for _, g := range tree[1:] {
		if got := w.stored(g.GrantID); got.State != capability.StateRevoked || got.RevokedVia != tree[0].GrantID {
			t.Fatalf("grant %s after the restart: %v via %q", g.GrantID, got.State, got.RevokedVia)
		}
	}
	if w.count(prefixMark) != 0 {
		t.Fatal("the finished job is still stored")
	}
	if n, err := w.svc.MarkPending(context.Background()); n != 0 || err != nil {
		t.Fatalf("a second run marked %d (%v)", n, err)
	}
}

// RunMarker is woken by a revocation and needs nobody to call it.
func TestRunMarkerMarksInTheBackground(t *testing.T) {
	w := newWorld(t, 3)
	nodes := w.chainOfNodes(2)
	tree := w.bulkTree(nodes, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.svc.RunMarker(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunMarker: %v", err)
		}
	}()
	w.revoke(security, tree[0].GrantID)
	deadline := time.Now().Add(10 * time.Second)
	for w.count(prefixMark) != 0 || w.stored(tree[len(tree)-1].GrantID).State != capability.StateRevoked {
		if time.Now().After(deadline) {
			t.Fatal("the background marker never finished")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Two revocations cover one grant: the stored outcome is the earliest
// revocation among its ancestors, whichever marking job runs first, and it
// is what the read paths showed before any marking. A grant that expired
// before every revocation stays expired.
func TestMarkingOutcomeDoesNotDependOnJobOrder(t *testing.T) {
	w := newWorld(t, 1)
	nodes := w.chainOfNodes(4)
	root := w.root(nodes[0], time.Hour, "tool:*")
	a := w.delegate(root, nodes[1], 0, "tool:*")
	b := w.delegate(a, nodes[2], 0, "tool:shell", "tool:fs")
	leaf := w.delegate(b, nodes[3], 0, "tool:shell")
	short := w.delegate(a, nodes[2], time.Minute, "tool:fs")

	w.clk.Advance(2 * time.Minute) // short expires
	w.revoke(agent(nodes[1]), b.GrantID)
	w.clk.Advance(time.Minute)
	second := w.revoke(security, root.GrantID)

	ids := []string{root.GrantID, a.GrantID, b.GrantID, leaf.GrantID, short.GrantID}
	before := map[string]capability.Grant{}
	for _, id := range ids {
		before[id] = w.get(id)
	}
	want := map[string]struct {
		state capability.State
		via   string
	}{
		root.GrantID:  {capability.StateRevoked, root.GrantID},
		a.GrantID:     {capability.StateRevoked, root.GrantID},
		b.GrantID:     {capability.StateRevoked, b.GrantID},
		leaf.GrantID:  {capability.StateRevoked, b.GrantID}, // b's revocation came first
		short.GrantID: {capability.StateExpired, ""},
	}
	for id, g := range before {
		if g.State != want[id].state || g.RevokedVia != want[id].via {
			t.Errorf("before marking, %s reads %v via %q, want %v via %q", id, g.State, g.RevokedVia, want[id].state, want[id].via)
		}
	}

	// The root's job runs first: the later revocation, covering the most.
	job := markJob{GrantID: root.GrantID}
	for {
		_, next, err := w.svc.markBatch(context.Background(), second.Sequence, job)
		if err != nil {
			t.Fatal(err)
		}
		if next.GrantID == "" {
			break
		}
		job = next
	}
	if _, err := w.svc.MarkPending(context.Background()); err != nil { // b's job
		t.Fatal(err)
	}
	for _, id := range ids {
		after := w.get(id)
		if after.State != before[id].State || after.RevokedVia != before[id].RevokedVia || !after.RevokedAt.Equal(before[id].RevokedAt) {
			t.Errorf("%s: read %v via %q at %v before marking, %v via %q at %v after", id,
				before[id].State, before[id].RevokedVia, before[id].RevokedAt, after.State, after.RevokedVia, after.RevokedAt)
		}
	}
	if got := w.stored(leaf.GrantID); got.RevokedVia != b.GrantID {
		t.Fatalf("stored leaf revoked via %q, want %s", got.RevokedVia, b.GrantID)
	}
	if got := w.stored(short.GrantID); got.State != capability.StateActive {
		t.Fatalf("the expired grant was marked %v", got.State)
	}
}

// The marker reads a large derived index in slices (descendantsAfter), not
// from its cursor to the index's end. Whatever the ids' bytes, the depth
// hint and the batch size, walking it batch by batch returns every id
// exactly once, in key order, and says when none remain.
func TestDescendantsAfterWalksTheIndexExactlyOnce(t *testing.T) {
	w := newWorld(t, 0)
	rng := rand.New(rand.NewPCG(7, 11))
	const ancestor = "grt_ancestor"
	alphabets := []string{"abcdefghijklmnopqrstuvwxyz234567", "ab", "\x00\x01\xfe\xff", "a\xff"}
	for round := range 40 {
		alphabet := alphabets[round%len(alphabets)]
		want := map[string]bool{}
		for range rng.IntN(300) {
			b := make([]byte, 1+rng.IntN(6))
			for i := range b {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
			want[string(b)] = true
		}
		sorted := slices.Sorted(maps.Keys(want))
		err := w.st.Update(context.Background(), func(tx store.Txn) error {
			if err := tx.Scan(derivedPrefix(ancestor), nil, func(k, _ []byte) error { return tx.Delete(bytes.Clone(k)) }); err != nil {
				return err
			}
			// Neighbours the walk must not reach.
			if err := tx.Put(derivedKey(ancestor+"\xff", "x"), nil); err != nil {
				return err
			}
			if err := tx.Put([]byte(prefixDerived+"grt_ancestor"), nil); err != nil {
				return err
			}
			for _, id := range sorted {
				if err := tx.Put(derivedKey(ancestor, id), nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		limit, depth := 1+rng.IntN(40), rng.IntN(maxMarkDepth+3)-1
		var got []string
		cursor := ""
		for batches := 0; ; batches++ {
			if batches > len(sorted)+1 {
				t.Fatalf("round %d: the walk does not end", round)
			}
			var (
				ids  []string
				more bool
			)
			err := w.st.View(context.Background(), func(tx store.ReadTxn) error {
				var err error
				ids, more, depth, err = descendantsAfter(tx, ancestor, cursor, depth, limit)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) > limit || (more && len(ids) != limit) {
				t.Fatalf("round %d: a batch of %d ids (more %v) with limit %d", round, len(ids), more, limit)
			}
			got = append(got, ids...)
			if !more {
				break
			}
			cursor = ids[len(ids)-1]
		}
		if !slices.Equal(got, sorted) {
			t.Fatalf("round %d (alphabet %q, limit %d): walked %d ids, want the %d stored, in order\ngot  %q\nwant %q", round, alphabet, limit, len(got), len(sorted), got, sorted)
		}
	}
}
