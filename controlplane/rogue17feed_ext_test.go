package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAnAgentsRevocationFeedIsNotWokenIntoAMessageByEveryTreesRevocations:
// an agent's revocation feed carries only its lineage's tombstones, but
// every batch of revocations in any tree was a message on it (no
// tombstone, the feed's new head): a rogue holding its lineage's stream
// share of feeds had the server send that many messages for each
// revocation anywhere, and learnt when other trees revoke. Such a batch
// now stands in for the feed's heartbeat only, at most once per heartbeat
// interval on the server's clock. Counted on a manual clock that does not
// move: 20 of another tree's revocations make no message before the
// agent's own; once the clock has moved a heartbeat on, the next one is
// the head the agent hears. (Fails with a message per batch.)
func TestAnAgentsRevocationFeedIsNotWokenIntoAMessageByEveryTreesRevocations(t *testing.T) {
	const others = 20
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RevocationHeartbeat = 10 * time.Minute })
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	own := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	other := register(t, admin, "other")
	var grants []held
	for range others + 1 {
		grants = append(grants, issueRoot(t, admin, other.Node.NodeId, time.Hour, "tool:*"))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := srv.Clients(rogue.Credential).Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	msgs := make(chan *tetherv1.WatchRevocationsResponse, 64)
	go func() {
		defer close(msgs)
		for stream.Receive() {
			msgs <- stream.Msg()
		}
	}()
	next := func(what string) *tetherv1.WatchRevocationsResponse {
		t.Helper()
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("the feed ended waiting for %s: %v", what, stream.Err())
			}
			return m
		case <-time.After(20 * time.Second):
			t.Fatalf("no message for 20s waiting for %s", what)
		}
		return nil
	}
	if m := next("the first message"); len(m.Tombstones) != 0 {
		t.Fatalf("first message %v", m)
	}

	for _, g := range grants[:others] {
		if _, err := revokeGrant(admin, g.grant.GrantId); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := revokeGrant(admin, own.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	empties := 0
	for {
		m := next("the rogue's own tombstone")
		if len(m.Tombstones) == 0 {
			empties++
			continue
		}
		if len(m.Tombstones) != 1 || m.Tombstones[0].GrantId != own.grant.GrantId || m.HeadSequence != mine.Sequence {
			t.Fatalf("the rogue's feed carried %v, want only its own tombstone at %d", m, mine.Sequence)
		}
		break
	}
	if empties != 0 {
		t.Fatalf("another tree's %d revocations made %d messages on the rogue's feed before its own; want none while the server's clock stays within a heartbeat", others, empties)
	}

	// A heartbeat on, another tree's revocation is the head the agent hears.
	clk.Advance(10 * time.Minute)
	last, err := revokeGrant(admin, grants[others].grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	if m := next("the head after a heartbeat"); len(m.Tombstones) != 0 || m.HeadSequence != last.Sequence {
		t.Fatalf("after a heartbeat the rogue's feed carried %v, want the head %d alone", m, last.Sequence)
	}
}
