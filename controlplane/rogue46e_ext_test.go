package controlplane_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-sixth hostile pass on the capability tree: an agent whose
// credential is being revoked, on a replica whose revocation feed fell
// behind the store.

// silentStreams are the streams a rogue holds open with a credential and
// sends nothing on: the node's session (after its hello) and a signals
// stream, each the node's session in its exit evidence.
type silentStreams struct {
	session *rawSession
	signals *connect.ServerStreamForClient[tetherv1.WatchSignalsResponse]
}

func openSilentStreams(t *testing.T, ctx context.Context, c *testserver.Clients, node string) *silentStreams {
	t.Helper()
	opened, err := openSessionIn(t, ctx, c, node)
	if err != nil {
		t.Fatalf("the session's first message: %v; want opened", err)
	}
	signals, err := c.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { signals.Close() })
	if !signals.Receive() || signals.Msg().GetOpened() == nil {
		t.Fatalf("the signals stream's first message: %v, %v; want opened", signals.Msg(), signals.Err())
	}
	return &silentStreams{session: opened, signals: signals}
}

// ends reads both streams to their end (or the context's, a guard) and
// returns how many ended unauthenticated, and their ends.
func (s *silentStreams) ends() (int, error, error) {
	for s.signals.Receive() {
	}
	var sessionEnd error
	for sessionEnd == nil {
		_, sessionEnd = s.session.stream.Receive()
	}
	n := 0
	for _, err := range []error{s.signals.Err(), sessionEnd} {
		if connect.CodeOf(err) == connect.CodeUnauthenticated {
			n++
		}
	}
	return n, s.signals.Err(), sessionEnd
}

// TestRogue46EACredentialRevokedWhileTheFeedRescansEndsItsSilentStreams:
// a rogue holding a worker's leaked credential keeps the worker's
// session and a signals stream open, sending nothing. The security team
// revokes the credential by value while the replica's revocation feed
// has fallen behind its store (store.ErrWatchLagged: a full buffer on
// Badger) and rescans. The replica's set holds the revocation (the
// replica took it), but the streams are ended only as the feed publishes
// a revocation (auth.Interceptor.EndRevokedStreams), and a rescan
// published nothing: both streams stayed open for as long as the node
// ran, after the feed had published a later revocation (a canary's: its
// stream ended). The rescan now publishes what it finds past what the
// feed had published, and both end unauthenticated.
func TestRogue46EACredentialRevokedWhileTheFeedRescansEndsItsSilentStreams(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	st := &laggingStore{Store: b}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Store = st })
	revokeWhileTheFeedRescans(t, srv, srv, st)
}

// revokeWhileTheFeedRescans plays the rescan scenario of the rogue46e
// tests: a worker's and a canary's credentials, minted on issuer, hold
// silent streams open on holder, whose store (lag) holds its revocation
// feed's new watch down across the worker's revocation by value on
// issuer. It fails the test unless holder refuses the worker's next call
// and, once its feed has published the canary's later revocation (both
// the canary's streams ended), has ended both the worker's streams
// unauthenticated. issuer and holder may be one server.
func revokeWhileTheFeedRescans(t *testing.T, issuer, holder *testserver.Server, lag *laggingStore) {
	t.Helper()
	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := issuer.AdminClients()
	root := register(t, admin, "planner")
	parent := issuer.Clients(root.Credential)
	worker := spawn(t, parent, root.Node.NodeId, "worker")
	canary := spawn(t, parent, root.Node.NodeId, "canary")
	rogue := openSilentStreams(t, ctx, holder.Clients(worker.Credential), worker.Node.NodeId)
	witness := openSilentStreams(t, ctx, holder.Clients(canary.Credential), canary.Node.NodeId)

	// The holder's feed hears nothing of the store from here on (its
	// watch falls behind; its new watch is held down across the
	// revocation); its reads and writes go on.
	release := sync.OnceFunc(lag.hold("grantstore.(*Service).followFeed"))
	defer release()
	if n := lag.lag("grantstore.(*Service).followFeed"); n != 1 {
		t.Fatalf("lagged %d store watches of the holder's revocation feed, want its one", n)
	}
	testserver.WaitFor(t, 30*time.Second, "the holder's feed to ask for a new watch", func() bool { return lag.holding("grantstore.(*Service).followFeed") >= 1 })
	if _, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: worker.Credential, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the worker's credential by value on the issuer: %v", err)
	}
	wantLimit(t, "a call with the revoked credential on the holder while its feed rescans", whoAmI(holder.Clients(worker.Credential)), connect.CodeUnauthenticated, "revoked")
	release()

	// The holder's feed rescans, then follows its new watch, which
	// publishes the canary's revocation: once the canary's streams on the
	// holder have ended, its feed is past its rescan.
	if _, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: canary.Credential, Reason: "a witness"})); err != nil {
		t.Fatal(err)
	}
	if n, sig, ses := witness.ends(); n != 2 || ctx.Err() != nil {
		t.Fatalf("the canary's streams on the holder after its revocation: signals %v, session %v; want both ended unauthenticated", sig, ses)
	}
	n, sig, ses := rogue.ends()
	t.Logf("the revoked credential's silent streams on the holder, after its rescan: %d of 2 ended unauthenticated (signals %v, session %v; the guard: %v)", n, sig, ses, ctx.Err())
	if n != 2 || ctx.Err() != nil {
		t.Fatalf("%d of the 2 silent streams of a credential revoked while the holder's feed rescanned ended, want 2: the rescan published nothing", n)
	}
}

// TestRogue46EACredentialRefreshedBeforeItsRevocationDiesWithIt: a rogue
// holding a worker's leaked credential opens the worker's session with
// it and, a third of its life left, is handed a fresh credential. The
// security team then revokes the leaked credential by value. The fresh
// one was another credential, of another id, which the revocation did not
// reach: every call took it, a session it opened was refreshed again, and
// so on for as long as the node ran — the revocation undone by waiting for
// one refresh. A session's refresh now keeps the credential's id (one
// line), and a revocation by value of an agent's credential lives as long
// as a credential of the line minted before it may: the fresh credential's
// calls, its stream and its session are refused.
func TestRogue46EACredentialRefreshedBeforeItsRevocationDiesWithIt(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, leaked, fresh, held := refreshThenRevoke(t, ctx, clk, srv, srv)
	wantLimit(t, "a call with the leaked credential", whoAmI(srv.Clients(leaked)), connect.CodeUnauthenticated, "revoked")

	const calls = 3
	served := 0
	for range calls {
		if err := whoAmI(srv.Clients(fresh)); err == nil {
			served++
		}
	}
	// A session the fresh credential opens after the revocation, refreshed
	// in its turn.
	again := ""
	if s, err := openSessionIn(t, ctx, srv.Clients(fresh), node); err == nil {
		clk.Advance(11 * time.Minute)
		again, _ = s.refreshed()
	}
	againServed := again != "" && whoAmI(srv.Clients(again)) == nil
	t.Logf("after the leaked credential's revocation, the credential refreshed from it before: %d of %d calls served; a session it opened handed out another: %v, served: %v", served, calls, again != "", againServed)
	if served != 0 || again != "" {
		t.Fatalf("a credential refreshed from the leaked one before its revocation: %d of %d calls served after it, and a session it opened refreshed it again (%v, served %v); want 0 and none", served, calls, again != "", againServed)
	}
	if n, sig, ses := held.ends(); n != 2 || ctx.Err() != nil {
		t.Fatalf("the streams the refreshed credential held open: signals %v, session %v; want both ended unauthenticated", sig, ses)
	}
	// A credential, not the node: the worker still runs.
	if n := getNode(t, admin, node); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the worker after its credential's revocation: %v, want running", n.State)
	}
}

// refreshThenRevoke plays the refresh scenario of the rogue46e tests: a
// worker spawned on issuer opens its session on holder with its
// credential (the leaked one), is handed a fresh credential there with a
// third of the leaked one's life left (clk, the servers' clock, moves 11
// of its 15 minutes), and holds the fresh credential's silent streams
// open on holder; the leaked credential is then revoked by value on
// issuer. It returns the worker's node, the leaked and the fresh
// credential, and the held streams. issuer and holder may be one server.
func refreshThenRevoke(t *testing.T, ctx context.Context, clk *clock.Manual, issuer, holder *testserver.Server) (node, leaked, fresh string, held *silentStreams) {
	t.Helper()
	admin := issuer.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, issuer.Clients(root.Credential), root.Node.NodeId, "worker")
	node, leaked = worker.Node.NodeId, worker.Credential
	session, err := openSessionIn(t, ctx, holder.Clients(leaked), node)
	if err != nil {
		t.Fatalf("the session's first message on the holder: %v; want opened", err)
	}
	clk.Advance(11 * time.Minute) // of 15: 4 minutes left
	fresh, err = session.refreshed()
	if err != nil || fresh == "" {
		t.Fatalf("a heartbeat on the holder with a third of the credential's life left: %q, %v; want a fresh credential", fresh, err)
	}
	held = openSilentStreams(t, ctx, holder.Clients(fresh), node)

	if _, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: leaked, Reason: "leaked in a build log"})); err != nil {
		t.Fatalf("revoking the leaked credential by value on the issuer: %v", err)
	}
	return node, leaked, fresh, held
}

// refreshed sends one heartbeat and returns the fresh credential the
// session hands out with its acknowledgement ("" when none is), or the
// error the session ended with.
func (s *rawSession) refreshed() (string, error) {
	if err := s.stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	for {
		resp, err := s.stream.Receive()
		if err != nil {
			return "", err
		}
		if c := resp.GetCredential().GetCredential(); c != "" {
			return c, nil
		}
		if resp.GetHeartbeatAck() == nil {
			continue
		}
		// The credential follows its acknowledgement, when one is due.
		resp, err = s.stream.Receive()
		if err != nil {
			return "", err
		}
		return resp.GetCredential().GetCredential(), nil
	}
}
