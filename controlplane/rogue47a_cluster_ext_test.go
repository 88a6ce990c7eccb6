package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-seventh hostile pass on the capability tree: an agent whose
// credential is revoked on one replica, talking to another whose
// revocation feed follows the store a few seconds late.

// stallingStore is a store whose watches opened by a function named
// opener deliver nothing while stalled, the watch still open (a feed
// that follows its store late: a busy replica, a slow etcd member), and
// deliver what they held once resumed. Unlike laggingStore's, such a
// watch never ends: its component believes it follows.
type stallingStore struct {
	store.Store
	opener string

	mu   sync.Mutex
	gate chan struct{} // closed while events flow
}

func newStallingStore(s store.Store, opener string) *stallingStore {
	open := make(chan struct{})
	close(open)
	return &stallingStore{Store: s, opener: opener, gate: open}
}

// stall holds every event of the opener's watches from now on until the
// returned function is called.
func (s *stallingStore) stall() (resume func()) {
	gate := make(chan struct{})
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
	return sync.OnceFunc(func() { close(gate) })
}

func (s *stallingStore) Watch(ctx context.Context, prefix []byte) (store.Watcher, error) {
	inner, err := s.Store.Watch(ctx, prefix)
	if err != nil || !strings.Contains(openerStack(), s.opener) {
		return inner, err
	}
	w := &stalledWatch{inner: inner, events: make(chan []store.Event)}
	go func() {
		defer close(w.events)
		for batch := range inner.Events() {
			s.mu.Lock()
			gate := s.gate
			s.mu.Unlock()
			select {
			case <-gate:
			case <-ctx.Done():
				return
			}
			select {
			case w.events <- batch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}

type stalledWatch struct {
	inner  store.Watcher
	events chan []store.Event
}

func (w *stalledWatch) Events() <-chan []store.Event { return w.events }
func (w *stalledWatch) Err() error                   { return w.inner.Err() }

// feedStallingPair is replicaPair with B's revocation feed's watches on
// lagB, which stalls them.
func feedStallingPair(t *testing.T, opts ...testserver.Option) (a, b *testserver.Server, lagB *stallingStore) {
	t.Helper()
	a, b = replicaPair(t, func(stB store.Store) store.Store {
		lagB = newStallingStore(stB, "grantstore.(*Service).followFeed")
		return lagB
	}, opts...)
	return a, b, lagB
}

// revokeOnAWithBsFeedStalled stalls B's revocation feed (until the
// returned resume, or the test's end), has the operator revoke on A the
// leaked credential or token req names, which A acknowledges, and checks
// that A refuses token, of the kind what, at once.
func revokeOnAWithBsFeedStalled(t *testing.T, ctx context.Context, a *testserver.Server, lagB *stallingStore, req *tetherv1.RevokeTokenRequest, token, what string) (resume func()) {
	t.Helper()
	resume = lagB.stall()
	t.Cleanup(resume)
	req.Reason = "leaked in a build log"
	if _, err := a.AdminClients().Auth.RevokeToken(ctx, connect.NewRequest(req)); err != nil {
		t.Fatalf("revoking the leaked %s on A: %v", what, err)
	}
	wantLimit(t, "a call with the revoked "+what+" on A", whoAmI(a.Clients(token)), connect.CodeUnauthenticated, "revoked")
	return resume
}

// TestRogue47AACredentialRevokedOnOneReplicaIsNotRefreshedOnAnotherWhoseFeedLags:
// the rogue holding a worker's leaked credential talks to replica B,
// whose revocation feed follows etcd late (here its watch delivers
// nothing for a while, still open). The security team revokes the
// credential by value on replica A; ten seconds later, before B's feed
// has it, the rogue sends B a heartbeat with a third of the credential's
// life left. B handed out a fresh credential of the line, minted ten
// seconds after the revocation was acknowledged: the revocation's
// tombstone lives a credential's lifetime and a 5-second leeway from its
// commit, so the fresh credential outlived it by five seconds, was
// served again on every replica once the tombstone dropped, and its own
// refresh then began the line anew, for as long as the node ran. A
// refresh now reads the line's record, which the revocation wrote with
// its tombstone: B refuses it, unary or on the session.
func TestRogue47AACredentialRevokedOnOneReplicaIsNotRefreshedOnAnotherWhoseFeedLags(t *testing.T) {
	clk := clock.NewManual(epoch) // both replicas' clock
	a, b, lagB := feedStallingPair(t, testserver.WithClock(clk))

	// A guard against a stream that stays open hanging the test; nothing
	// waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := a.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, a.Clients(root.Credential), root.Node.NodeId, "worker")
	node, leaked := worker.Node.NodeId, worker.Credential
	session, err := openSessionIn(t, ctx, b.Clients(leaked), node)
	if err != nil {
		t.Fatalf("the session's first message on B: %v; want opened", err)
	}
	clk.Advance(11 * time.Minute) // of 15: 4 minutes left, a refresh due

	resume := revokeOnAWithBsFeedStalled(t, ctx, a, lagB, &tetherv1.RevokeTokenRequest{Token: leaked}, leaked, "credential")
	clk.Advance(10 * time.Second) // past the credentials' 5-second leeway

	hb, hbErr := b.Clients(leaked).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: node}))
	unary := ""
	if hbErr == nil {
		unary = hb.Msg.GetCredential().GetCredential()
	}
	onSession, sessionErr := session.refreshed()
	t.Logf("on B, 10 s after A acknowledged the revocation, its feed behind: a unary heartbeat handed out a credential %v (%v), the session %v (%v)", unary != "", hbErr, onSession != "", sessionErr)
	if unary == "" && onSession == "" {
		wantLimit(t, "the unary heartbeat's refresh on B", hbErr, connect.CodeUnauthenticated, "revoked")
		wantLimit(t, "the session's refresh on B", sessionErr, connect.CodeUnauthenticated, "revoked")
		return
	}

	// What the fresh credential is worth: B's feed catches up, the
	// tombstone drops a lifetime and a leeway after the revocation, and
	// the credential, 10 s younger than the revocation, outlives it.
	fresh := unary
	if fresh == "" {
		fresh = onSession
	}
	resume()
	testserver.WaitFor(t, 30*time.Second, "B's feed to hear the revocation", func() bool { return whoAmI(b.Clients(fresh)) != nil })
	clk.Advance(15*time.Minute - 4*time.Second) // 6 s past the tombstone's drop, 4 s before the fresh credential's expiry
	testserver.WaitFor(t, 30*time.Second, "A's feed to drop the revocation's tombstone", func() bool { return whoAmI(a.Clients(fresh)) == nil })
	again, err := a.Clients(fresh).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: node}))
	revived := ""
	if err == nil {
		revived = again.Msg.GetCredential().GetCredential()
	}
	clk.Advance(15 * time.Minute) // every credential of the line minted before, or up to 10 s after, the revocation has expired
	served := revived != "" && whoAmI(a.Clients(revived)) == nil
	t.Fatalf("B handed out a credential of the revoked line 10 s after its revocation (unary %v, session %v); once the tombstone dropped it was refreshed again on A (%v), and that one served 30 minutes after the revocation: %v; want no credential of a revoked line handed out", unary != "", onSession != "", revived != "", served)
}

// TestRogue47AARevokedAdminTokenMintsNoTokenOnAReplicaWhoseFeedLags: a
// rogue holding a leaked admin token talks to replica B, whose
// revocation feed follows etcd late (its watch open, delivering nothing
// for a while). The security team revokes the token on replica A; a
// moment later, before B's feed has it, the rogue asks B for a token of
// its own. B minted it, of a new id the revocation never named, an admin's
// for as long as the rogue asked: the revocation acknowledged, and the
// rogue an admin still, once B's feed had caught up, on every replica. A
// token is now minted only once the caller's token's record, which the
// revocation wrote with its tombstone, says it is not revoked: B refuses.
func TestRogue47AARevokedAdminTokenMintsNoTokenOnAReplicaWhoseFeedLags(t *testing.T) {
	a, b, lagB := feedStallingPair(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	adminA := a.AdminClients()
	leaked, err := adminA.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Subject: "release-bot", Role: tetherv1.Role_ROLE_ADMIN, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if err := whoAmI(b.Clients(leaked.Msg.Token)); err != nil {
		t.Fatalf("the admin token's first call through B: %v", err)
	}

	resume := revokeOnAWithBsFeedStalled(t, ctx, a, lagB, &tetherv1.RevokeTokenRequest{TokenId: leaked.Msg.TokenId}, leaked.Msg.Token, "admin token")

	var (
		minted   []string
		refusals []error
	)
	for _, req := range []*tetherv1.CreateTokenRequest{
		{Subject: "release-bot", Role: tetherv1.Role_ROLE_ADMIN, Ttl: durationpb.New(controlplane.MaxOperatorTokenTTL)},
		{ToolServer: "rogue-gate", Ttl: durationpb.New(controlplane.MaxOperatorTokenTTL)},
	} {
		got, err := b.Clients(leaked.Msg.Token).Auth.CreateToken(ctx, connect.NewRequest(req))
		if err != nil {
			refusals = append(refusals, err)
			continue
		}
		minted = append(minted, got.Msg.Token)
	}
	t.Logf("on B, its feed behind, after A acknowledged the admin token's revocation: %d of 2 tokens minted for it (an admin's, a tool server's)", len(minted))
	if len(minted) != 0 {
		// What they are worth once B's feed has caught up.
		resume()
		testserver.WaitFor(t, 30*time.Second, "B's feed to hear the revocation", func() bool { return whoAmI(b.Clients(leaked.Msg.Token)) != nil })
		served := 0
		for _, token := range minted {
			if whoAmI(a.Clients(token)) == nil && whoAmI(b.Clients(token)) == nil {
				served++
			}
		}
		t.Fatalf("B minted %d of 2 tokens for an admin token whose revocation A had acknowledged, %d of them served on A and B once B's feed had caught up; want none minted", len(minted), served)
	}
	for _, err := range refusals {
		wantLimit(t, "a token asked of B with the revoked admin token", err, connect.CodeUnauthenticated, "revoked")
	}
}
