package grantstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// beforeUpdate is a store whose next Update runs hook first, once: the
// moment between a decision made on a snapshot and its write.
type beforeUpdate struct {
	store.Store
	mu   sync.Mutex
	hook func()
}

func (s *beforeUpdate) arm(hook func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = hook
}

func (s *beforeUpdate) Update(ctx context.Context, fn func(store.Txn) error) error {
	s.mu.Lock()
	hook := s.hook
	s.hook = nil
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s.Store.Update(ctx, fn)
}

// TestRogue38IATokenRefreshedWhileTheRevocationCommitsDiesWithItsTombstone:
// the rogue refreshes its grant over and over while an operator revokes
// it. One refresh reads the grant after the revocation decided (its clock
// read) and before it committed, and is minted at that later time. The
// tombstone's DropAfter was counted from the revocation's decision, so it
// left every verifier's set while the token still verified: an offline
// verifier (a gate that never asks the control plane) accepted the revoked
// token for the time the revocation took to commit. The revocation is now
// stamped when it commits, after every refresh that could miss it read its
// clock.
func TestRogue38IATokenRefreshedWhileTheRevocationCommitsDiesWithItsTombstone(t *testing.T) {
	w := newWorld(t, 0)
	hooked := &beforeUpdate{Store: w.st}
	svc, err := New(Config{Store: hooked, Tree: agentTree{w.tree}, Clock: w.clk, Keys: func() capability.KeyRing { return w.ring }, TokenTTL: capability.MaxTokenTTL, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	nodes := w.chainOfNodes(2)
	rogue := nodes[1]
	issued, err := svc.IssueRoot(context.Background(), operator, RootRequest{HolderNodeID: rogue, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g := issued.Grant

	const commitTook = time.Minute // a loaded committer; the rogue adds the load
	var refreshed Issued
	hooked.arm(func() {
		w.clk.Advance(commitTook)
		r, err := svc.Refresh(context.Background(), agent(rogue), g.GrantID)
		if err != nil {
			t.Errorf("the refresh racing the revocation: %v", err)
		}
		refreshed = r
	})
	res, err := svc.Revoke(context.Background(), security, Target{GrantID: g.GrantID}, "stop the rogue")
	if err != nil {
		t.Fatal(err)
	}
	if refreshed.Token == "" {
		t.Fatal("the rogue's refresh did not run between the revocation's decision and its write")
	}

	// An honest offline verifier that follows the feed: it holds the
	// tombstone the feed carries and prunes it at its DropAfter.
	var tomb capability.Tombstone
	err = w.st.View(context.Background(), func(tx store.ReadTxn) error {
		raw, err := tx.Get(tombstoneKey(res.Sequence))
		if err != nil {
			return err
		}
		tomb, err = decodeTombstone(raw)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := capability.NewVerifier("tether", Audience, capability.MaxLeeway)
	if err != nil {
		t.Fatal(err)
	}
	var set capability.TombstoneSet
	if err := set.Add(tomb); err != nil {
		t.Fatal(err)
	}
	for at := w.clk.Now(); !at.After(refreshed.TokenExpiresAt.Add(capability.MaxLeeway + time.Second)); at = at.Add(5 * time.Second) {
		set.Prune(at)
		claims, err := verifier.Verify(refreshed.Token, w.ring, at)
		if err != nil {
			continue
		}
		if _, revoked := set.Revoked(claims.GrantID, claims.Chain); !revoked {
			t.Fatalf("%s after the revocation committed, an offline verifier accepts the rogue's refreshed token (expiry %s): its tombstone (revoked at %s, dropped after %s) is gone",
				at.Sub(w.clk.Now()), refreshed.TokenExpiresAt.Format(time.TimeOnly), tomb.RevokedAt.Format(time.TimeOnly), tomb.DropAfter.Format(time.TimeOnly))
		}
	}
}
