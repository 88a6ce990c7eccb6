package grantstore

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// tombstonesRead counts the tombstones an Update's scans of the feed
// visit.
type tombstonesRead struct {
	store.Store
	visited atomic.Int64
}

func (s *tombstonesRead) Update(ctx context.Context, fn func(store.Txn) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error { return fn(tombstonesReadTxn{tx, s}) })
}

type tombstonesReadTxn struct {
	store.Txn
	s *tombstonesRead
}

func (tx tombstonesReadTxn) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if !bytes.Equal(prefix, []byte(prefixTombstone)) {
		return tx.Txn.Scan(prefix, start, fn)
	}
	return tx.Txn.Scan(prefix, start, func(k, v []byte) error {
		tx.s.visited.Add(1)
		return fn(k, v)
	})
}

// TestRogue40OPrunerStopsAtTheFirstGrantTombstoneStillNeeded: a rogue
// delegates and revokes in a loop, each revocation a live tombstone for
// MaxTokenTTL + MaxLeeway. Since the thirty-eighth pass a grant's drop is
// counted from its revocation's commit, a little past the decision's
// bound, which the pruner took for a bearer token's (kept until the token
// expires): it skipped each one instead of stopping, and every prune —
// once a minute, in one write transaction — read every live tombstone
// the rogue had made. It stops at the first grant tombstone still needed,
// as it did before; a bearer token's is still skipped.
func TestRogue40OPrunerStopsAtTheFirstGrantTombstoneStillNeeded(t *testing.T) {
	w := newWorld(t, 0)
	read := &tombstonesRead{Store: w.st}
	hooked := &beforeUpdate{Store: read}
	svc, err := New(Config{Store: hooked, Tree: agentTree{w.tree}, Clock: w.clk, Keys: func() capability.KeyRing { return w.ring }, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rogue := w.chainOfNodes(2)[1]
	const revocations = 100
	var first time.Time
	for i := range revocations {
		issued, err := svc.IssueRoot(ctx, operator, RootRequest{HolderNodeID: rogue, Scopes: []string{"tool:*"}, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		// The revocation commits a millisecond after it was decided.
		hooked.arm(func() { w.clk.Advance(time.Millisecond) })
		if _, err := svc.Revoke(ctx, security, Target{GrantID: issued.Grant.GrantID}, "rogue's loop"); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = w.clk.Now()
		}
	}
	// A bearer token's tombstone among them, kept for its day.
	if _, err := svc.RevokeBearer(ctx, "tok_rogue40o", w.clk.Now().Add(24*time.Hour), 0, time.Second, "bearer", nil); err != nil {
		t.Fatal(err)
	}

	read.visited.Store(0)
	if n, err := svc.PruneTombstones(ctx); n != 0 || err != nil {
		t.Fatalf("with none due, pruned %d (%v)", n, err)
	}
	if got := read.visited.Load(); got > 1 {
		t.Errorf("a prune with none of %d grant tombstones due read %d of them, want 1 (the first still needed)", revocations, got)
	}

	// Past the first half's drops: those go, the scan stops at the next.
	w.clk.Set(capability.DropAfter(first.Add(49 * time.Millisecond)).Add(time.Nanosecond))
	read.visited.Store(0)
	if n, err := svc.PruneTombstones(ctx); n != 50 || err != nil {
		t.Fatalf("pruned %d (%v), want the first 50", n, err)
	}
	if got := read.visited.Load(); got > 51 {
		t.Errorf("pruning 50 read %d tombstones, want at most 51", got)
	}

	// Past every grant's drop: the bearer token's tombstone is skipped,
	// not a stop, and stays.
	w.clk.Set(capability.DropAfter(w.clk.Now()).Add(time.Hour))
	if n, err := svc.PruneTombstones(ctx); n != 50 || err != nil {
		t.Fatalf("pruned %d (%v), want the other 50 grants' tombstones", n, err)
	}
	read.visited.Store(0)
	if n, err := svc.PruneTombstones(ctx); n != 0 || err != nil {
		t.Fatalf("pruned %d (%v), want the bearer token's tombstone kept", n, err)
	}
	if got := read.visited.Load(); got != 1 {
		t.Errorf("read %d tombstones, want the bearer token's alone", got)
	}
}
