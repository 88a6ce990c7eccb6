package grantstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// TestADisplayFollowerBehindARevocationFloodSkipsToTheNewest: a display
// follower (WatchNewestRevocations with newest, the console's feed page)
// opened with the newest tombstones only, but once behind it was sent
// every tombstone after its position, in order: a rogue's flood of 1,200
// revocations committed between two of its reads came, all of it, before
// the operator's own revocation behind it. A display follower skips to the
// newest `newest` now whenever it is behind, as at its opening. (Fails if
// more than 500 tombstones reach the follower before the operator's.)
func TestADisplayFollowerBehindARevocationFloodSkipsToTheNewest(t *testing.T) {
	w := newWorld(t, 0)
	// The rogue's grants on six nodes of its tree: a node holds at most
	// DefaultMaxPerNode live grants of a kind.
	nodes := w.chainOfNodes(7)
	rogues, victim := nodes[1:], nodes[0]
	w.runFeed()
	ctx := context.Background()
	const flood, shown = 1200, 500
	for i := range flood {
		w.root(rogues[i%len(rogues)], time.Hour, "tool:*")
	}
	mine := w.root(victim, time.Hour, "tool:*")
	seen := errors.New("the operator's revocation reached the follower")
	delivered, opened := 0, false
	watch, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := w.svc.WatchNewestRevocations(watch, WholeFeed(), 0, shown, func(m FeedMessage) error {
		if !opened {
			// The follower is busy with its opening while the rogue
			// floods and then the operator revokes: it is behind.
			opened = true
			for _, rogue := range rogues {
				if _, err := w.svc.Revoke(ctx, security, Target{HolderNodeID: rogue}, "flood"); err != nil {
					return err
				}
			}
			res := w.revoke(security, mine.GrantID)
			w.waitFeed("the operator's revocation", func(_ []capability.Tombstone, head, _ uint64) bool { return head >= res.Sequence })
			return nil
		}
		for _, tomb := range m.Tombstones {
			delivered++
			if tomb.GrantID == mine.GrantID {
				return seen
			}
		}
		return nil
	})
	if !errors.Is(err, seen) {
		t.Fatalf("the follower ended with %v after %d tombstones", err, delivered)
	}
	if delivered > shown {
		t.Errorf("the display follower was sent %d tombstones of the rogue's flood of %d before the operator's revocation, want at most %d (the newest)", delivered-1, flood, shown)
	}
}
