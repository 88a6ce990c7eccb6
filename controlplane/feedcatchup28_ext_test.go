package controlplane_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestRogue28AFeedPageOpenedJustAfterARevocationShowsIt: since the
// twenty-seventh pass a follower's first message of the revocation feed
// waits until this replica's feed holds every revocation the store held
// when it opened (TestAFeedOpenedJustAfterARevocationStartsWithIt). The
// display's two other ways into the feed did not wait: a page of the
// older feed (before_sequence, the console's ?before=) and a display
// stream opening with the newest tombstones (newest) were answered from
// the feed as it stood, so an operator who revoked a rogue's grant and
// looked at once was shown the feed without it (on etcd,
// TestAPageOfTheOlderFeedIsAskedForWhole failed this way, a page of
// nothing). Here the feed's watch is held down across the revocation:
// each answer waits for the feed to reach what the store held, and shows
// the revocation.
func TestRogue28AFeedPageOpenedJustAfterARevocationShowsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		page bool // before_sequence; otherwise a display stream (newest)
	}{{"a page of the older feed", true}, {"a display opening with the newest", false}} {
		t.Run(tc.name, func(t *testing.T) {
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

			release := sync.OnceFunc(st.hold("grantstore.(*Service).followFeed")) // the feed's watch stays down until released
			defer release()
			if n := st.lag("grantstore.(*Service).followFeed"); n != 1 {
				t.Fatalf("lagged %d store watches of the revocation feed, want its one", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
			defer cancel()
			rev, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: g.grant.GrantId}, Reason: "compromised"}))
			if err != nil {
				t.Fatal(err)
			}
			req := &tetherv1.WatchRevocationsRequest{Newest: 10}
			if tc.page {
				req.BeforeSequence = rev.Msg.Sequence + 1
			}
			// The client's call returns once the server answers its
			// headers, with the first message: it is made aside.
			type opened struct {
				msg *tetherv1.WatchRevocationsResponse
				err error
			}
			first := make(chan opened, 1)
			go func() {
				stream, err := admin.Capability.WatchRevocations(ctx, connect.NewRequest(req))
				if err != nil {
					first <- opened{err: err}
					return
				}
				defer stream.Close()
				if !stream.Receive() {
					first <- opened{err: fmt.Errorf("the feed sent nothing: %v", stream.Err())}
					return
				}
				first <- opened{msg: stream.Msg()}
				if !tc.page {
					<-ctx.Done() // a display stream stays open until the test ends
				}
			}()
			// The server holds the stream open before the feed has caught
			// up (or answers at once, as it did, without the revocation).
			feed := tetherv1connect.CapabilityServiceWatchRevocationsProcedure
			testserver.WaitFor(t, time.Minute, "the display's stream to open, or its answer", func() bool {
				if len(first) > 0 {
					return true
				}
				v, _ := scrapeMetrics(t, srv.HTTP, srv.URL).value("tether_server_open_streams", map[string]string{"procedure": feed})
				return v == 1
			})
			release()
			got := <-first
			if got.err != nil {
				t.Fatal(got.err)
			}
			var found bool
			for _, ts := range got.msg.Tombstones {
				found = found || ts.GrantId == g.grant.GrantId
			}
			if !found || got.msg.HeadSequence < rev.Msg.Sequence {
				t.Fatalf("the display's first message (head %d) lacks the revocation (sequence %d) acknowledged before it was opened: %v", got.msg.HeadSequence, rev.Msg.Sequence, got.msg.Tombstones)
			}
		})
	}
}
