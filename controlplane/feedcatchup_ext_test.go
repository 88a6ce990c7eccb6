package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestAFeedOpenedJustAfterARevocationStartsWithIt: the revocation feed is
// filled by the store's watch, a moment after each commit. A verifier that
// opened the feed in that moment (a new replica's verifier, or one
// reconnecting just after an operator's revocation) was sent a first
// message without the revocation already acknowledged, and took it as the
// whole set. Here the feed's watch is held down across the revocation (as
// a loaded machine delays it): the first message waits for the feed to
// reach what the store held when the follower opened it, and carries the
// tombstone. Seen failing before the fix: the first message had none (CI
// once failed TestBulkRevocation/by_holder this way).
func TestAFeedOpenedJustAfterARevocationStartsWithIt(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	st := &laggingStore{Store: b}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	worker := register(t, admin, "worker")
	g := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "tool:shell")

	release := st.hold("grantstore.(*Service).followFeed") // the feed's watch stays down until released
	if n := st.lag("grantstore.(*Service).followFeed"); n != 1 {
		t.Fatalf("lagged %d store watches of the revocation feed, want its one", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: g.grant.GrantId}, Reason: "compromised"})); err != nil {
		t.Fatal(err)
	}
	// The client's call returns once the server answers its headers, with
	// the first message: it is made aside.
	type opened struct {
		msg *tetherv1.WatchRevocationsResponse
		err error
	}
	first := make(chan opened, 1)
	go func() {
		stream, err := admin.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err != nil {
			first <- opened{err: err}
			return
		}
		defer stream.Close()
		defer func() { <-ctx.Done() }() // open until the test ends: the stream gauge counts it
		if !stream.Receive() {
			first <- opened{err: fmt.Errorf("the feed sent nothing: %v", stream.Err())}
			return
		}
		first <- opened{msg: stream.Msg()}
	}()
	// The server holds the stream open before the feed has caught up.
	feed := tetherv1connect.CapabilityServiceWatchRevocationsProcedure
	testserver.WaitFor(t, time.Minute, "the follower's stream to open", func() bool {
		v, _ := scrapeMetrics(t, srv.HTTP, srv.URL).value("tether_server_open_streams", map[string]string{"procedure": feed})
		return v == 1
	})
	release()
	got := <-first
	if got.err != nil {
		t.Fatal(got.err)
	}
	msg := got.msg
	var found bool
	for _, ts := range msg.Tombstones {
		found = found || ts.GrantId == g.grant.GrantId
	}
	if !found {
		t.Fatalf("the feed's first message (head %d) lacks the revocation acknowledged before it was opened: %v", msg.HeadSequence, msg.Tombstones)
	}
}
