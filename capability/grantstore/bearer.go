package grantstore

import (
	"context"
	"fmt"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// Bearer tokens (operator tokens and the other tokens the control plane
// mints for its own API) are revoked through the same feed as grants: one
// tombstone named by the token's id, durable before the revocation is
// acknowledged, followed by every replica's feed watch. It differs from a
// grant's only in how long it stays: until the token's own expiry (plus the
// parser's leeway), which can be months — so the pruner skips such a
// tombstone rather than stopping at it (PruneTombstones).

// RevokeBearer writes a tombstone for the bearer token tokenID, which
// expires at expiresAt, in one transaction with also (which records the
// revocation wherever the caller keeps its tokens, and may return an error
// to write nothing). It adds the tombstone to this replica's set before it
// returns, so the next call with the token is refused here at once; the
// other replicas refuse it as soon as their feed watch delivers it.
//
// reminted is how long a token of the same id minted before the
// revocation commits may live past its mint (an agent's credential, whose
// sessions refresh it under its id: the credentials' lifetime), 0 for a
// token never minted again: the tombstone lives until then too, counted
// from the commit, as a grant's is (rogue38i).
func (s *Service) RevokeBearer(ctx context.Context, tokenID string, expiresAt time.Time, reminted, leeway time.Duration, reason string, also func(tx store.Txn, revokedAt time.Time) error) (uint64, error) {
	if err := capability.ValidateID("token_id", tokenID); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	now := s.cfg.Clock.Now()
	t := capability.Tombstone{GrantID: tokenID, RevokedAt: now, DropAfter: expiresAt.Add(leeway), Reason: clipReason(reason)}
	if !t.DropAfter.After(now) {
		t.DropAfter = now.Add(leeway) // an expired token: kept briefly, harmlessly
	}
	err := s.cfg.Store.Update(ctx, func(tx store.Txn) error {
		if also != nil {
			if err := also(tx, now); err != nil {
				return err
			}
		}
		head, err := getCounter(tx, feedHeadKey)
		if err != nil {
			return err
		}
		if reminted > 0 {
			if later := s.cfg.Clock.Now().Add(reminted + leeway); later.After(t.DropAfter) {
				t.DropAfter = later
			}
		}
		head++
		t.Sequence = head
		raw, err := encodeTombstone(t)
		if err != nil {
			return err
		}
		if err := tx.Put(tombstoneKey(head), raw); err != nil {
			return err
		}
		return putCounter(tx, feedHeadKey, head)
	})
	if err != nil {
		return 0, err
	}
	if err := s.tombstones.Add(t); err != nil {
		return 0, err
	}
	return t.Sequence, nil
}

// BearerRevoked reports whether this replica's tombstone set holds a
// revocation of the bearer token tokenID: a lock-free map lookup, made on
// every authenticated call. Until the feed's first load (just after
// start) it waits for it, so a restarted replica never accepts a revoked
// token it has not read yet; it fails (ErrStopped) if the feed stopped
// before loading. While the feed's watch has fallen behind the store and
// the feed rescans, the set may lack a revocation another replica took:
// see FeedFollowing.
func (s *Service) BearerRevoked(ctx context.Context, tokenID string) (bool, error) {
	select {
	case <-s.feed.ready:
	default:
		select {
		case <-s.feed.ready:
		case <-s.feed.stopped:
			return false, fmt.Errorf("%w: the revocation feed is not loaded", ErrStopped)
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	_, ok := s.tombstones.Lookup(tokenID)
	return ok, nil
}

// FeedFollowing reports whether this replica's feed follows the store:
// false from the end of a watch that fell behind (store.ErrWatchLagged)
// to the rescan's load, when the tombstone set may lack revocations the
// store holds. A caller that must not miss one (the interceptor's check
// of a bearer token) reads the store meanwhile: a replica whose watch
// ended behind served, until its rescan, a token another replica had
// revoked and acknowledged (rogue44i test).
func (s *Service) FeedFollowing() bool {
	select {
	case <-s.feed.current():
		return true
	default:
		return false
	}
}

// RevocationsChanged returns a channel closed at this replica's next
// revocation (a grant's or a bearer token's) or pruning: an open stream
// looks its token up again (BearerRevoked) when it closes, and ends once
// the token is revoked. The tombstone set holds a revocation before the
// channel of its arrival is closed.
func (s *Service) RevocationsChanged() <-chan struct{} {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	return s.feed.changed
}
