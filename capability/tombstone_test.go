package capability_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

func tomb(seq uint64, grantID string, revokedAt time.Time) capability.Tombstone {
	return capability.Tombstone{Sequence: seq, GrantID: grantID, RevokedAt: revokedAt, DropAfter: capability.DropAfter(revokedAt)}
}

func TestTombstoneSetZeroValueIsEmpty(t *testing.T) {
	var set capability.TombstoneSet
	if via, ok := set.Revoked("g_1", []string{"g_0"}); ok || via != "" {
		t.Fatalf("empty set reports %q revoked", via)
	}
	if set.Head() != 0 || set.Len() != 0 || len(set.Tombstones()) != 0 {
		t.Fatal("empty set is not empty")
	}
	if n := set.Prune(t0); n != 0 {
		t.Fatalf("Prune on empty set dropped %d", n)
	}
}

func TestTombstoneSetRevoked(t *testing.T) {
	var set capability.TombstoneSet
	if err := set.Add(tomb(1, "g_a", t0), tomb(2, "g_a1x", t0)); err != nil {
		t.Fatal(err)
	}
	chainOfA1x := []string{"g_root", "g_a", "g_a1"}
	tests := []struct {
		name    string
		grantID string
		chain   []string
		via     string
		revoked bool
	}{
		{"the grant itself", "g_a", []string{"g_root"}, "g_a", true},
		{"a child of a revoked grant", "g_a1", []string{"g_root", "g_a"}, "g_a", true},
		{"the topmost revoked grant is reported", "g_a1x", chainOfA1x, "g_a", true},
		{"a sibling subtree", "g_b", []string{"g_root"}, "", false},
		{"the root above the revocation", "g_root", nil, "", false},
	}
	for _, tt := range tests {
		via, ok := set.Revoked(tt.grantID, tt.chain)
		if ok != tt.revoked || via != tt.via {
			t.Errorf("%s: Revoked = (%q, %v), want (%q, %v)", tt.name, via, ok, tt.via, tt.revoked)
		}
	}
}

func TestTombstoneSetAddIsIdempotentAndOrderInsensitive(t *testing.T) {
	var set capability.TombstoneSet
	later := tomb(7, "g_a", t0.Add(time.Minute))
	earlier := tomb(3, "g_a", t0)
	if err := set.Add(later); err != nil {
		t.Fatal(err)
	}
	if err := set.Add(earlier, tomb(5, "g_b", t0)); err != nil {
		t.Fatal(err)
	}
	if err := set.Add(later); err != nil {
		t.Fatal(err)
	}
	got, ok := set.Lookup("g_a")
	if !ok {
		t.Fatal("g_a missing")
	}
	if !got.RevokedAt.Equal(t0) || got.Sequence != 3 {
		t.Errorf("kept revocation %v seq %d, want the earlier one (t0, 3)", got.RevokedAt, got.Sequence)
	}
	if !got.DropAfter.Equal(later.DropAfter) {
		t.Errorf("DropAfter = %v, want the later %v", got.DropAfter, later.DropAfter)
	}
	if set.Head() != 7 || set.Len() != 2 {
		t.Errorf("Head = %d, Len = %d, want 7, 2", set.Head(), set.Len())
	}
}

func TestTombstoneSetRefusesBatchWithoutGrantID(t *testing.T) {
	var set capability.TombstoneSet
	err := set.Add(tomb(1, "g_a", t0), capability.Tombstone{Sequence: 2})
	if !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("err = %v, want ErrInvalidGrant", err)
	}
	if set.Len() != 0 || set.Head() != 0 {
		t.Fatal("a refused batch was partly applied")
	}
	if err := set.Replace([]capability.Tombstone{{Sequence: 1}}, 1); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("Replace: err = %v, want ErrInvalidGrant", err)
	}
}

func TestTombstoneSetPrune(t *testing.T) {
	var set capability.TombstoneSet
	old, young := tomb(1, "g_old", t0), tomb(2, "g_young", t0.Add(time.Minute))
	if err := set.Add(old, young); err != nil {
		t.Fatal(err)
	}
	if n := set.Prune(old.DropAfter); n != 0 {
		t.Fatalf("Prune at DropAfter dropped %d; a tombstone lives through its DropAfter", n)
	}
	if n := set.Prune(old.DropAfter.Add(time.Nanosecond)); n != 1 {
		t.Fatalf("Prune after DropAfter dropped %d, want 1", n)
	}
	if _, ok := set.Revoked("g_old", nil); ok {
		t.Fatal("pruned tombstone still revokes")
	}
	if _, ok := set.Revoked("g_young", nil); !ok {
		t.Fatal("young tombstone was pruned")
	}
	if set.Head() != 2 {
		t.Fatalf("Head = %d after prune, want 2 (pruning does not rewind the feed)", set.Head())
	}
}

func TestTombstoneSetReplaceAndList(t *testing.T) {
	var set capability.TombstoneSet
	if err := set.Add(tomb(1, "g_gone", t0)); err != nil {
		t.Fatal(err)
	}
	if err := set.Replace([]capability.Tombstone{tomb(9, "g_z", t0), tomb(4, "g_y", t0)}, 12); err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Revoked("g_gone", nil); ok {
		t.Fatal("Replace kept a tombstone not in the snapshot")
	}
	list := set.Tombstones()
	if len(list) != 2 || list[0].GrantID != "g_y" || list[1].GrantID != "g_z" {
		t.Fatalf("Tombstones() = %+v, want g_y then g_z (sequence order)", list)
	}
	if set.Head() != 12 {
		t.Fatalf("Head = %d, want 12", set.Head())
	}
}

func TestTombstoneFor(t *testing.T) {
	tr := newGrantTree(t)
	at := t0.Add(3 * time.Minute)
	revoked, err := capability.Revoke(tr.a, "operator:alice", nil, "incident", at)
	if err != nil {
		t.Fatal(err)
	}
	got, err := capability.TombstoneFor(revoked, 41)
	if err != nil {
		t.Fatal(err)
	}
	want := capability.Tombstone{Sequence: 41, GrantID: "g_a", RevokedAt: at, DropAfter: at.Add(capability.MaxTokenTTL + capability.MaxLeeway), Reason: "incident", Holder: tr.a.HolderNodeID, RevokedBy: "operator:alice"}
	if got != want {
		t.Fatalf("TombstoneFor = %+v, want %+v", got, want)
	}
	if _, err := capability.TombstoneFor(tr.a1, 42); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("active grant: err = %v", err)
	}
	marked, err := capability.MarkRevokedVia(tr.a1, revoked)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capability.TombstoneFor(marked, 42); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("grant revoked via an ancestor needs no tombstone of its own: err = %v", err)
	}
}

// TestDropAfterOutlivesEveryToken is the safety argument for dropping
// tombstones: the last token minted before a revocation, at the longest TTL,
// is refused by expiry at DropAfter even by the most lenient verifier.
func TestDropAfterOutlivesEveryToken(t *testing.T) {
	tr := newGrantTree(t)
	ring := newRing(t, t0)
	revokedAt := t0.Add(10 * time.Minute) // a whole second: the tightest case
	token, exp, err := newMinter(t).Mint(ring, tr.root, revokedAt, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := capability.NewVerifier(testIssuer, testAudience, capability.MaxLeeway)
	if err != nil {
		t.Fatal(err)
	}
	drop := capability.DropAfter(revokedAt)
	if _, err := lenient.Verify(token, ring, exp.Add(capability.MaxLeeway-time.Nanosecond)); err != nil {
		t.Fatalf("the token is still accepted just before exp+leeway: %v", err)
	}
	if exp.Add(capability.MaxLeeway).After(drop) {
		t.Fatalf("token accepted until %v but tombstone dropped at %v", exp.Add(capability.MaxLeeway), drop)
	}
	if _, err := lenient.Verify(token, ring, drop); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("at DropAfter: err = %v, want ErrTokenExpired", err)
	}
}

func TestTombstoneSetFreshness(t *testing.T) {
	var set capability.TombstoneSet
	if err := set.CheckFresh(t0, time.Minute); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("never synced: err = %v, want ErrFeedStale", err)
	}
	set.MarkSynced(5, t0)
	if err := set.CheckFresh(t0.Add(time.Minute), time.Minute); err != nil {
		t.Fatalf("within budget: %v", err)
	}
	if err := set.CheckFresh(t0.Add(time.Minute+time.Nanosecond), time.Minute); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("beyond budget: err = %v, want ErrFeedStale", err)
	}
	set.MarkSynced(3, t0.Add(-time.Hour)) // a late, older message moves nothing back
	if set.Head() != 5 {
		t.Fatalf("Head = %d, want 5", set.Head())
	}
	if err := set.CheckFresh(t0.Add(time.Minute), time.Minute); err != nil {
		t.Fatalf("an older sync moved the clock back: %v", err)
	}
	if err := set.Add(tomb(6, "g_a", t0)); err != nil {
		t.Fatal(err)
	}
	if err := set.CheckFresh(t0.Add(time.Minute), time.Minute); err != nil {
		t.Fatalf("Add forgot the sync time: %v", err)
	}
}

// TestTombstoneSetConcurrentReaders checks, under -race, that readers see
// each batch whole and never see a revocation disappear.
func TestTombstoneSetConcurrentReaders(t *testing.T) {
	var set capability.TombstoneSet
	const batches, perBatch = 200, 5
	var readers sync.WaitGroup
	done := make(chan struct{})
	for r := range 4 {
		readers.Go(func() {
			seen := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				n := 0
				for b := range batches {
					_, first := set.Revoked(fmt.Sprintf("g_%d_0", b), nil)
					_, last := set.Revoked(fmt.Sprintf("g_%d_%d", b, perBatch-1), nil)
					// Each call loads the newest snapshot, so the second
					// may see a batch the first did not — never the reverse.
					if first && !last {
						t.Errorf("reader %d saw half of batch %d", r, b)
						return
					}
					if first {
						n++
					}
				}
				if n < seen {
					t.Errorf("reader %d saw %d batches after seeing %d", r, n, seen)
					return
				}
				seen = n
			}
		})
	}
	for b := range batches {
		batch := make([]capability.Tombstone, perBatch)
		for i := range batch {
			batch[i] = tomb(uint64(b*perBatch+i+1), fmt.Sprintf("g_%d_%d", b, i), t0)
		}
		if err := set.Add(batch...); err != nil {
			t.Fatal(err)
		}
		set.MarkSynced(set.Head(), t0)
		set.Prune(t0) // drops nothing; exercises the writer path concurrently
	}
	close(done)
	readers.Wait()
	if set.Len() != batches*perBatch || set.Head() != batches*perBatch {
		t.Fatalf("Len = %d, Head = %d", set.Len(), set.Head())
	}
}
