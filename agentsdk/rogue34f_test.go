package agentsdk_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue34fOperator is the grant store's caller for the test's grants.
var rogue34fOperator = grantstore.Caller{Principal: "operator:test", Roles: []string{capability.RoleAdmin}}

// rogue34fFollowing is an HTTP/2 client that dials whichever server
// address it holds: the verifier's Conn keeps its base URL while the
// test restarts the control plane on another port.
func rogue34fFollowing(addr *atomic.Pointer[string]) *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, *addr.Load())
	}}}
}

func rogue34fRegister(t *testing.T, c *testserver.Clients, name string) *tetherv1.RegisterRootResponse {
	t.Helper()
	resp, err := c.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name}))
	if err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return resp.Msg
}

// rogue34fRevokeMany issues n root grants to a fresh node and revokes them
// (n tombstones in one revocation).
func rogue34fRevokeMany(t *testing.T, srv *testserver.Server, node string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if _, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: node, Scopes: []string{"tool:*"}, TTL: time.Hour}); err != nil {
			t.Fatalf("root %d: %v", i, err)
		}
	}
	if res, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{HolderNodeID: node}, "filler"); err != nil || len(res.GrantIDs) != n {
		t.Fatalf("revoking the fillers: %d revoked, %v", len(res.GrantIDs), err)
	}
}

// TestRogue34FASnapshotInSeveralMessagesKeepsTheOldSetUntilItsLast: the
// rogue's grant was revoked after a thousand others (its tombstone is the
// feed's 1,001st), and a tool server's verifier applied it. The control
// plane is then restored from a copy taken before a later revocation, so
// the verifier's position is past the store's head, and the feed answers
// it with a snapshot of the 1,001 live tombstones: two messages, the
// rogue's in the second. The verifier replaced its set with the first
// message, and accepted the rogue's revoked token until the second
// arrived. It now keeps its old set (adding the copy's tombstones to it)
// until the snapshot's last message, which says it does not continue.
func TestRogue34FASnapshotInSeveralMessagesKeepsTheOldSetUntilItsLast(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 1,000 revocations; make test and CI run them.")
	}
	dir := filepath.Join(t.TempDir(), "data")
	big := func(cfg *controlplane.Config) { cfg.GrantMaxPerNode = 1100 }
	srv := testserver.StartIn(t, dir, big)
	ctx := context.Background()
	admin := srv.AdminClients()
	filler := rogue34fRegister(t, admin, "filler")
	rogue := rogue34fRegister(t, admin, "rogue")
	rogue34fRevokeMany(t, srv, filler.Node.NodeId, grantstore.MaxFeedBatch)
	x, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: x.Grant.GrantID}, "rogue"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	backup := filepath.Join(t.TempDir(), "backup")
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	srv = testserver.StartIn(t, dir, big)
	later, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	res, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: later.Grant.GrantID}, "later")
	if err != nil {
		t.Fatal(err)
	}

	var addr atomic.Pointer[string]
	host := srv.URL[len("http://"):]
	addr.Store(&host)
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{
		Conn:            agentsdk.Dial("http://tether.test", srv.Admin, agentsdk.WithHTTPClient(rogue34fFollowing(&addr))),
		StalenessBudget: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		restored bool
		seen     []*tetherv1.WatchRevocationsResponse
		accepted []int
	)
	agentsdk.OnFeedMessage(v, func(msg *tetherv1.WatchRevocationsResponse) {
		mu.Lock()
		defer mu.Unlock()
		if !restored {
			return
		}
		if _, err := v.Verify(ctx, x.Token); !errors.Is(err, capability.ErrGrantRevoked) {
			accepted = append(accepted, len(seen))
		}
		seen = append(seen, msg)
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- v.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	testserver.WaitFor(t, time.Minute, "the verifier at the later revocation", func() bool { return v.Head() >= res.Sequence })
	if _, err := v.Verify(ctx, x.Token); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("before the restore, the rogue's token: %v", err)
	}

	srv.Stop()
	mu.Lock()
	restored = true
	mu.Unlock()
	srv = testserver.StartIn(t, backup, big)
	restoredHost := srv.URL[len("http://"):]
	addr.Store(&restoredHost)
	// The hook runs after the verifier applied a message: the head can
	// reach the snapshot's before the hook has seen its last message.
	testserver.WaitFor(t, time.Minute, "the restored store's snapshot applied and its last message seen", func() bool {
		head := v.Head()
		mu.Lock()
		defer mu.Unlock()
		return head == res.Sequence-1 && len(seen) > 0 && !seen[len(seen)-1].Continues
	})

	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 2 || !seen[0].Snapshot || len(seen[0].Tombstones) != grantstore.MaxFeedBatch {
		t.Fatalf("the restored server's answer: %d messages, the first a snapshot %v of %d tombstones; want a snapshot of %d and more", len(seen), len(seen) > 0 && seen[0].Snapshot, len(seen[0].Tombstones), grantstore.MaxFeedBatch)
	}
	if len(accepted) > 0 {
		t.Fatalf("the verifier accepted the rogue's revoked token after message(s) %v of the snapshot's %d", accepted, len(seen))
	}
	if _, err := v.Verify(ctx, x.Token); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("after the snapshot, the rogue's token: %v", err)
	}
	if _, err := v.Verify(ctx, later.Token); err != nil {
		t.Fatalf("after the snapshot of a store that never revoked it, the later grant's token: %v", err)
	}
}

// TestRogue34FAVerifierStartingIsNotReadyBeforeTheFeedsHead: the rogue's
// grant was revoked after a thousand others. A tool server's verifier
// that starts then (a new replica of the tool server, or one restarted)
// opens the feed at 0 and is sent the 1,001 live tombstones in two
// messages, the rogue's in the second. It was ready, and fresh, with the
// first, and accepted the rogue's revoked token until the second arrived.
// A message that continues now neither readies nor refreshes it: until
// the feed's head, every check fails closed.
func TestRogue34FAVerifierStartingIsNotReadyBeforeTheFeedsHead(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 1,000 revocations; make test and CI run them.")
	}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.GrantMaxPerNode = 1100 })
	ctx := context.Background()
	admin := srv.AdminClients()
	filler := rogue34fRegister(t, admin, "filler")
	rogue := rogue34fRegister(t, admin, "rogue")
	rogue34fRevokeMany(t, srv, filler.Node.NodeId, grantstore.MaxFeedBatch)
	x, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	res, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: x.Grant.GrantID}, "rogue")
	if err != nil {
		t.Fatal(err)
	}
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: srv.Clients(srv.Admin), StalenessBudget: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		seen     []*tetherv1.WatchRevocationsResponse
		accepted []int
	)
	agentsdk.OnFeedMessage(v, func(msg *tetherv1.WatchRevocationsResponse) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := v.Verify(ctx, x.Token); err == nil {
			accepted = append(accepted, len(seen))
		}
		seen = append(seen, msg)
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- v.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	<-v.Ready()
	if v.Head() < res.Sequence {
		t.Fatalf("the verifier was ready at %d, before the rogue's revocation at %d", v.Head(), res.Sequence)
	}
	testserver.WaitFor(t, time.Minute, "the feed's messages up to its head observed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1].HeadSequence >= res.Sequence
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 2 || len(seen[0].Tombstones) != grantstore.MaxFeedBatch {
		t.Fatalf("the feed opened at 0: %d messages, the first of %d tombstones; want %d and more", len(seen), len(seen[0].Tombstones), grantstore.MaxFeedBatch)
	}
	if len(accepted) > 0 {
		t.Fatalf("the starting verifier accepted the rogue's revoked token after message(s) %v of the feed's %d", accepted, len(seen))
	}
	if _, err := v.Verify(ctx, x.Token); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("at the feed's head, the rogue's token: %v", err)
	}
}
