package grantstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

func sequences(ts []capability.Tombstone) []uint64 {
	out := make([]uint64, len(ts))
	for i, t := range ts {
		out[i] = t.Sequence
	}
	return out
}

func TestFeedResumesFromASequence(t *testing.T) {
	w := newWorld(t, 0)
	node := w.chainOfNodes(1)[0]
	w.runFeed()
	var grants []capability.Grant
	for range 4 {
		grants = append(grants, w.root(node, time.Hour, "tool:*"))
	}
	for _, g := range grants[:3] {
		w.revoke(security, g.GrantID)
		w.clk.Advance(time.Minute)
	}
	w.waitFeed("head 3", func(_ []capability.Tombstone, head, _ uint64) bool { return head == 3 })

	for _, tc := range []struct {
		after    uint64
		want     []uint64
		snapshot bool
	}{
		{0, []uint64{1, 2, 3}, false},
		{1, []uint64{2, 3}, false},
		{3, []uint64{}, false},
		{99, []uint64{1, 2, 3}, true}, // ahead of this feed: another history
	} {
		m := w.firstMessages(tc.after, 1)[0]
		if got := sequences(m.Tombstones); !slices.Equal(got, tc.want) || m.Snapshot != tc.snapshot || m.Head != 3 {
			t.Errorf("after %d: got %v snapshot=%v head=%d, want %v snapshot=%v head 3", tc.after, got, m.Snapshot, m.Head, tc.want, tc.snapshot)
		}
	}
	// An idle stream heartbeats with the follower's position.
	if hb := w.firstMessages(3, 2)[1]; len(hb.Tombstones) != 0 || hb.Head != 3 || hb.Snapshot {
		t.Fatalf("heartbeat = %+v", hb)
	}
	// A live follower receives the next revocation.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan FeedMessage, 16)
	go func() {
		_ = w.svc.WatchRevocations(ctx, 3, func(m FeedMessage) error {
			select {
			case got <- m:
			default:
			}
			return nil
		})
	}()
	<-got // the first message: nothing new
	w.revoke(security, grants[3].GrantID)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-got:
			if len(m.Tombstones) == 0 {
				continue // a heartbeat
			}
			if s := sequences(m.Tombstones); !slices.Equal(s, []uint64{4}) || m.Head != 4 || m.Tombstones[0].GrantID != grants[3].GrantID {
				t.Fatalf("live message: %v head %d", s, m.Head)
			}
			return
		case <-deadline:
			t.Fatal("the live follower never received tombstone 4")
		}
	}
}

// A revoked grant's tombstone stays in the feed until its DropAfter has
// passed, then leaves it; the grant stays revoked; a follower positioned
// before the pruned part gets a snapshot; sequences are never reused.
func TestPruningKeepsTombstonesUntilDropAfter(t *testing.T) {
	w := newWorld(t, 0)
	node := w.chainOfNodes(1)[0]
	w.runFeed()
	g1 := w.root(node, time.Hour, "tool:*")
	g2 := w.root(node, time.Hour, "tool:*")
	w.revoke(security, g1.GrantID)
	revokedAt := w.clk.Now()
	w.clk.Advance(time.Minute)
	w.revoke(security, g2.GrantID)
	w.waitFeed("both tombstones", func(log []capability.Tombstone, _, _ uint64) bool { return len(log) == 2 })

	w.clk.Set(capability.DropAfter(revokedAt))
	if n, err := w.svc.PruneTombstones(context.Background()); n != 0 || err != nil {
		t.Fatalf("at DropAfter exactly, pruned %d (%v); a token could still be accepted then", n, err)
	}
	w.clk.Advance(time.Nanosecond)
	if n, err := w.svc.PruneTombstones(context.Background()); n != 1 || err != nil {
		t.Fatalf("just after DropAfter, pruned %d (%v), want 1", n, err)
	}
	w.waitFeed("compaction to 1", func(log []capability.Tombstone, head, compacted uint64) bool {
		return compacted == 1 && head == 2 && len(log) == 1
	})
	if _, ok := w.svc.Tombstones().Lookup(g1.GrantID); ok {
		t.Error("the service's own set kept the pruned tombstone")
	}
	if got := w.get(g1.GrantID); got.State != capability.StateRevoked {
		t.Fatalf("after pruning its tombstone the grant reads %v", got.State)
	}
	check := func(when string) {
		t.Helper()
		m := w.firstMessages(0, 1)[0]
		if !m.Snapshot || !slices.Equal(sequences(m.Tombstones), []uint64{2}) || m.Head != 2 {
			t.Fatalf("%s: a follower at 0 got snapshot=%v %v head %d, want a snapshot of [2] at 2", when, m.Snapshot, sequences(m.Tombstones), m.Head)
		}
		m = w.firstMessages(1, 1)[0]
		if m.Snapshot || !slices.Equal(sequences(m.Tombstones), []uint64{2}) {
			t.Fatalf("%s: a follower at 1 got snapshot=%v %v", when, m.Snapshot, sequences(m.Tombstones))
		}
	}
	check("live")
	w.restart()
	w.runFeed()
	check("after a restart")

	w.clk.Set(capability.DropAfter(revokedAt.Add(time.Minute)).Add(time.Nanosecond))
	if n, err := w.svc.PruneTombstones(context.Background()); n != 1 || err != nil {
		t.Fatalf("pruned %d (%v), want the second tombstone", n, err)
	}
	g3 := w.root(node, time.Hour, "tool:*")
	if res := w.revoke(security, g3.GrantID); res.Sequence != 3 {
		t.Fatalf("the next revocation got sequence %d, want 3", res.Sequence)
	}
}

// Revoking a revoked grant again, directly or through an ancestor, is a
// success that writes nothing.
func TestRevokeIsIdempotent(t *testing.T) {
	w := newWorld(t, 0)
	nodes := w.chainOfNodes(2)
	root := w.root(nodes[0], time.Hour, "tool:*")
	child := w.delegate(root, nodes[1], 0, "tool:shell")
	first := w.revoke(security, root.GrantID)
	for _, again := range []struct {
		caller Caller
		id     string
	}{{security, root.GrantID}, {agent(nodes[0]), child.GrantID}} {
		res := w.revoke(again.caller, again.id)
		if len(res.GrantIDs) != 0 || res.Sequence != first.Sequence {
			t.Fatalf("revoking %s again: %+v, want nothing written at head %d", again.id, res, first.Sequence)
		}
	}
	if n := w.count(prefixTombstone); n != 1 {
		t.Fatalf("%d tombstones", n)
	}
	// Authority still comes first: the holder learns nothing.
	if _, err := w.svc.Revoke(context.Background(), agent(nodes[1]), Target{GrantID: child.GrantID}, ""); !errors.Is(err, capability.ErrNotRevoker) {
		t.Fatalf("the holder revoking its own revoked grant: %v", err)
	}
}
