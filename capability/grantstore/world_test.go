package grantstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// world is a grant store on a real Badger directory, with a manual clock
// and a supervisor tree for the nodes grants are held by.
type world struct {
	t     *testing.T
	dir   string
	st    store.Store
	clk   *clock.Manual
	ring  capability.KeyRing
	tree  *tree.Tree
	svc   *Service
	batch int
	// stops stops what runs on the current store, before it closes.
	stops []func()
}

// security is the caller that may revoke anything.
var security = Caller{Principal: "operator:sec", Roles: []string{capability.RoleSecurity}}

// operator issues root grants.
var operator = Caller{Principal: "operator:alice"}

func agent(nodeID string) Caller { return Caller{Principal: capability.AgentPrincipal(nodeID)} }

func newWorld(t *testing.T, markBatch int) *world {
	t.Helper()
	key, err := capability.NewSigningKey(nil, epoch, epoch)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, dir: t.TempDir(), clk: clock.NewManual(epoch), ring: capability.KeyRing{Keys: []capability.SigningKey{key}}, batch: markBatch}
	w.open()
	t.Cleanup(func() {
		w.stop()
		_ = w.st.Close()
	})
	return w
}

func (w *world) stop() {
	for _, stop := range w.stops {
		stop()
	}
	w.stops = nil
}

// open opens the store on the world's directory and builds a fresh
// Service on it, as a restarted control plane would.
func (w *world) open() {
	w.t.Helper()
	st, err := badgerstore.OpenBadger(w.dir, badgerstore.BadgerOptions{Logger: quiet})
	if err != nil {
		w.t.Fatal(err)
	}
	w.st = st
	w.tree = &tree.Tree{Store: st, Clock: w.clk, Limits: tree.DefaultLimits}
	w.svc = w.service(st)
}

func (w *world) service(st store.Store) *Service {
	w.t.Helper()
	svc, err := New(Config{Store: st, Tree: agentTree{w.tree}, Clock: w.clk, Keys: func() capability.KeyRing { return w.ring }, MarkBatch: w.batch, Heartbeat: 20 * time.Millisecond, Log: quiet})
	if err != nil {
		w.t.Fatal(err)
	}
	return svc
}

// restart closes the store and reopens it: nothing in memory survives.
func (w *world) restart() {
	w.t.Helper()
	w.stop()
	if err := w.st.Close(); err != nil {
		w.t.Fatal(err)
	}
	w.open()
}

// chainOfNodes registers a root node and a line of descendants below it,
// root first.
func (w *world) chainOfNodes(n int) []string {
	w.t.Helper()
	ctx := context.Background()
	root, err := w.tree.RegisterRoot(ctx, "root", nil, "operator:alice")
	if err != nil {
		w.t.Fatal(err)
	}
	ids := []string{root.NodeID}
	for i := 1; i < n; i++ {
		child, err := w.tree.Spawn(ctx, ids[i-1], "child", nil, "operator:alice", func(*tree.Node) error { return nil })
		if err != nil {
			w.t.Fatal(err)
		}
		ids = append(ids, child.NodeID)
	}
	return ids
}

func (w *world) root(holder string, ttl time.Duration, scopes ...string) capability.Grant {
	w.t.Helper()
	issued, err := w.svc.IssueRoot(context.Background(), operator, RootRequest{HolderNodeID: holder, Scopes: scopes, TTL: ttl})
	if err != nil {
		w.t.Fatal(err)
	}
	return issued.Grant
}

func (w *world) delegate(parent capability.Grant, holder string, ttl time.Duration, scopes ...string) capability.Grant {
	w.t.Helper()
	issued, err := w.svc.Delegate(context.Background(), agent(parent.HolderNodeID), DelegateRequest{ParentGrantID: parent.GrantID, HolderNodeID: holder, Scopes: scopes, TTL: ttl})
	if err != nil {
		w.t.Fatal(err)
	}
	return issued.Grant
}

// bulkTree writes a root grant for holders[0] and fanout grants at each
// further level, each held by the next node, straight into the store in
// one transaction (as the benchmark does), and returns every grant, root
// first.
func (w *world) bulkTree(holders []string, fanout int) []capability.Grant {
	w.t.Helper()
	now := w.clk.Now()
	root, err := capability.NewRoot(capability.RootRequest{GrantID: id.New(id.Grant), Issuer: "operator:alice", HolderNodeID: holders[0], Scopes: []string{"tool:*"}, TTL: time.Hour}, now)
	if err != nil {
		w.t.Fatal(err)
	}
	all := []capability.Grant{root}
	level := []capability.Grant{root}
	for depth := 1; depth < len(holders); depth++ {
		var next []capability.Grant
		for _, parent := range level {
			for range fanout {
				g, err := capability.Delegate(parent, capability.DelegateRequest{
					GrantID: id.New(id.Grant), Issuer: capability.AgentPrincipal(parent.HolderNodeID), HolderNodeID: holders[depth], Scopes: []string{"tool:shell"},
				}, holders[:depth], now)
				if err != nil {
					w.t.Fatal(err)
				}
				next = append(next, g)
			}
		}
		all = append(all, next...)
		level = next
	}
	err = w.st.Update(context.Background(), func(tx store.Txn) error {
		for _, g := range all {
			if err := PutNewGrantIn(tx, w.tree, g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return all
}

// stored reads a grant as stored, without the chain walk of effective.
func (w *world) stored(grantID string) capability.Grant {
	w.t.Helper()
	var g capability.Grant
	err := w.st.View(context.Background(), func(tx store.ReadTxn) error {
		var err error
		g, _, err = getGrant(tx, grantID)
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return g
}

// get reads a grant as the API shows it.
func (w *world) get(grantID string) capability.Grant {
	w.t.Helper()
	g, err := w.svc.Get(context.Background(), operator, grantID)
	if err != nil {
		w.t.Fatal(err)
	}
	return g
}

// count counts keys under a prefix.
func (w *world) count(prefix string) int {
	w.t.Helper()
	n := 0
	err := w.st.View(context.Background(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte(prefix), nil, func(_, _ []byte) error { n++; return nil })
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *world) revoke(caller Caller, grantID string) RevokeResult {
	w.t.Helper()
	res, err := w.svc.Revoke(context.Background(), caller, Target{GrantID: grantID}, "test")
	if err != nil {
		w.t.Fatalf("revoke %s: %v", grantID, err)
	}
	return res
}

// runFeed runs the service's feed follower until the test ends and waits
// for its first load.
func (w *world) runFeed() {
	w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	svc := w.svc
	go func() { done <- svc.RunFeed(ctx) }()
	w.stops = append(w.stops, func() {
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("RunFeed: %v", err)
		}
	})
	select {
	case <-svc.feed.ready:
	case <-time.After(10 * time.Second):
		w.t.Fatal("the feed never loaded")
	}
}

// waitFeed waits until the in-memory feed satisfies cond.
func (w *world) waitFeed(what string, cond func(log []capability.Tombstone, head, compacted uint64) bool) {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.svc.feed.mu.Lock()
		ok := cond(w.svc.feed.log, w.svc.feed.head, w.svc.feed.compacted)
		w.svc.feed.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for the feed: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// firstMessages collects the first n messages WatchRevocations sends a
// follower positioned at after.
func (w *world) firstMessages(after uint64, n int) []FeedMessage {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []FeedMessage
	enough := errors.New("enough")
	err := w.svc.WatchRevocations(ctx, after, func(m FeedMessage) error {
		got = append(got, m)
		if len(got) == n {
			return enough
		}
		return nil
	})
	if !errors.Is(err, enough) {
		w.t.Fatalf("WatchRevocations(%d) ended with %v after %d messages", after, err, len(got))
	}
	return got
}

// faultyStore is the real store with one kind of fault injected: after
// allow successful Updates, every further Update fails without running,
// as if the process died before committing. It also records the most
// writes one Update made.
type faultyStore struct {
	store.Store
	mu        sync.Mutex
	allow     int
	updates   int
	maxWrites atomic.Int64
}

var errInjected = errors.New("injected crash before commit")

func (f *faultyStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	f.mu.Lock()
	if f.updates >= f.allow {
		f.mu.Unlock()
		return errInjected
	}
	f.updates++
	f.mu.Unlock()
	return f.Store.Update(ctx, func(tx store.Txn) error {
		counting := &countingTxn{Txn: tx}
		err := fn(counting)
		if n := counting.writes; n > f.maxWrites.Load() {
			f.maxWrites.Store(n)
		}
		return err
	})
}

type countingTxn struct {
	store.Txn
	writes int64
}

func (c *countingTxn) Put(k, v []byte) error { c.writes++; return c.Txn.Put(k, v) }
func (c *countingTxn) Delete(k []byte) error { c.writes++; return c.Txn.Delete(k) }
