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
// the rogue's child refreshes its grant over and over while an operator
// revokes the rogue's grant (by its id, or the rogue's whole subtree). One
// refresh reads the chain after the revocation decided (its clock read)
// and before it committed, and is minted at that later time. The
// tombstone's DropAfter was counted from the decision, so it left every
// verifier's set while the token still verified: an offline verifier (a
// gate that never asks the control plane) accepted the revoked token for
// the time the revocation took to commit. The drop is now counted from a
// clock read in the committing transaction, after every refresh that
// could miss the revocation read its clock.
func TestRogue38IATokenRefreshedWhileTheRevocationCommitsDiesWithItsTombstone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target func(rogueGrant string, rogueNode string) Target
	}{
		{"grant", func(g, _ string) Target { return Target{GrantID: g} }},
		{"subtree", func(_, n string) Target { return Target{SubtreeNodeID: n} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 0)
			hooked := &beforeUpdate{Store: w.st}
			svc, err := New(Config{Store: hooked, Tree: agentTree{w.tree}, Clock: w.clk, Keys: func() capability.KeyRing { return w.ring }, TokenTTL: capability.MaxTokenTTL, Log: quiet})
			if err != nil {
				t.Fatal(err)
			}
			nodes := w.chainOfNodes(3)
			rogue, child := nodes[1], nodes[2]
			issued, err := svc.IssueRoot(context.Background(), operator, RootRequest{HolderNodeID: rogue, Scopes: []string{"tool:*"}, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			delegated, err := svc.Delegate(context.Background(), agent(rogue), DelegateRequest{ParentGrantID: issued.Grant.GrantID, HolderNodeID: child, Scopes: []string{"tool:shell"}})
			if err != nil {
				t.Fatal(err)
			}

			const commitTook = time.Minute // a loaded committer; the rogue adds the load
			var refreshed Issued
			hooked.arm(func() {
				w.clk.Advance(commitTook)
				r, err := svc.Refresh(context.Background(), agent(child), delegated.Grant.GrantID)
				if err != nil {
					t.Errorf("the refresh racing the revocation: %v", err)
				}
				refreshed = r
			})
			res, err := svc.Revoke(context.Background(), security, tc.target(issued.Grant.GrantID, rogue), "stop the rogue")
			if err != nil {
				t.Fatal(err)
			}
			if refreshed.Token == "" {
				t.Fatal("the child's refresh did not run between the revocation's decision and its write")
			}

			// An honest offline verifier that follows the feed: it holds
			// the tombstone the feed carries and prunes it at its DropAfter.
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
			if tomb.GrantID != issued.Grant.GrantID {
				t.Fatalf("the revocation's tombstone is for %s, want the rogue's grant %s", tomb.GrantID, issued.Grant.GrantID)
			}
			verifier, err := capability.NewVerifier("tether", Audience, capability.MaxLeeway)
			if err != nil {
				t.Fatal(err)
			}
			var set capability.TombstoneSet
			if err := set.Add(tomb); err != nil {
				t.Fatal(err)
			}
			accepted := 0
			for at := w.clk.Now(); !at.After(refreshed.TokenExpiresAt.Add(capability.MaxLeeway + time.Second)); at = at.Add(5 * time.Second) {
				set.Prune(at)
				claims, err := verifier.Verify(refreshed.Token, w.ring, at)
				if err != nil {
					continue
				}
				accepted++
				if _, revoked := set.Revoked(claims.GrantID, claims.Chain); !revoked {
					t.Fatalf("%s after the revocation committed, an offline verifier accepts the child's refreshed token (expiry %s): the tombstone of its chain (revoked at %s, dropped after %s) is gone",
						at.Sub(w.clk.Now()), refreshed.TokenExpiresAt.Format(time.TimeOnly), tomb.RevokedAt.Format(time.TimeOnly), tomb.DropAfter.Format(time.TimeOnly))
				}
			}
			if accepted == 0 {
				t.Fatal("the refreshed token never verified: the probe proves nothing")
			}
		})
	}
}
