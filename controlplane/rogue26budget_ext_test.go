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
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// readCountingStore is the server's real Badger store, counting the Views
// that read at least big keys (a Get, or a key a Scan passed to its
// caller): the reads of a large subtree, which nothing else in these tests
// comes near.
type readCountingStore struct {
	store.Store
	big int

	mu    sync.Mutex
	reads int
}

type keyCountingRead struct {
	store.ReadTxn
	keys int
}

func (r *keyCountingRead) Get(key []byte) ([]byte, error) { r.keys++; return r.ReadTxn.Get(key) }
func (r *keyCountingRead) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return r.ReadTxn.Scan(prefix, start, func(k, v []byte) error { r.keys++; return fn(k, v) })
}

func (s *readCountingStore) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error {
		r := &keyCountingRead{ReadTxn: tx}
		err := fn(r)
		if r.keys >= s.big {
			s.mu.Lock()
			s.reads++
			s.mu.Unlock()
		}
		return err
	})
}

func (s *readCountingStore) bigReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// rogue26Tree starts a server on a counting Badger store whose rate
// budgets are bigBurst requests at 100 a second (a request every 10 ms of
// the manual clock), and registers a rogue root to which the operator (on
// its own budget) gives 2,048 children: a subtree of 2,049 nodes, three
// pages of a thousand, whose every read the store counts.
func rogue26Tree(t *testing.T) (srv *testserver.Server, st *readCountingStore, clk *clock.Manual, root *tetherv1.RegisterRootResponse) {
	t.Helper()
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st = &readCountingStore{Store: b, big: 2049}
	clk = clock.NewManual(epoch)
	srv = testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.Store = st
		cfg.RateLimit, cfg.RateBurst = 100, bigBurst
	})
	admin := srv.AdminClients()
	root = register(t, admin, "rogue")
	for b := range 8 {
		clk.Advance(2 * bigBurst / 100 * time.Second)
		children := make([]*tetherv1.SpawnBatchChild, 256)
		for i := range children {
			children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("w-%d-%d", b, i)}
		}
		if _, err := admin.Agent.SpawnBatch(context.Background(), connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: root.Node.NodeId, Children: children})); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * bigBurst / 100 * time.Second)
	return srv, st, clk, root
}

// TestRogue26ARogueCannotReadItsLargeSubtreeForOneRequestOnceItsBudgetIsLow: a
// listing of a subtree costs a request per thousand nodes read
// (rogue10 test), charged once the subtree is read. Charged only when the
// budget could pay it, a listing refused for its price had still read
// the whole subtree, for the one request its call took at the Gate: a
// rogue that kept its budget below a listing's price (calling as each
// request refilled) had its 2,049-node subtree read 30 times for 30
// requests, where its price is three; so did a page of its subtree's
// grants (ListGrants by subtree_node_id), which reads the whole subtree
// too. The price of work done is now taken all the same, the budget going
// into debt, and the work answered: 30 requests buy 10 reads.
func TestRogue26ARogueCannotReadItsLargeSubtreeForOneRequestOnceItsBudgetIsLow(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the two 2,049-node trees this test builds; make test and CI run them.")
	}
	listings := map[string]func(c *testserver.Clients, root string) error{
		"ListNodes": func(c *testserver.Clients, _ string) error {
			_, err := c.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{}))
			return err
		},
		"ListGrants": func(c *testserver.Clients, root string) error {
			_, err := c.Capability.ListGrants(context.Background(), connect.NewRequest(&tetherv1.ListGrantsRequest{SubtreeNodeId: root}))
			return err
		},
	}
	for name, listing := range listings {
		t.Run(name, func(t *testing.T) { rogueReadsItsSubtreeOnALowBudget(t, listing) })
	}
}

func rogueReadsItsSubtreeOnALowBudget(t *testing.T, listing func(c *testserver.Clients, root string) error) {
	srv, st, clk, root := rogue26Tree(t)
	rogue := srv.Clients(root.Credential)
	list := func() error { return listing(rogue, root.Node.NodeId) }
	// The full budget buys its hundred listings, three requests each.
	listings := 0
	var refusal error
	for refusal == nil && listings <= bigBurst {
		if refusal = list(); refusal == nil {
			listings++
		}
	}
	if listings != bigBurst/3 {
		t.Fatalf("the rogue listed its subtree %d times on a budget of %d, want %d; refused: %v", listings, bigBurst, bigBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)

	// Now a request at a time: each refill of one request lets one call
	// past the Gate, and the rest of its price is not there. It is taken
	// all the same, the budget going into debt: the listing is answered,
	// and the next two refills are refused at the Gate.
	before := st.bigReads()
	const rounds = 30
	answered := 0
	for round := range rounds {
		clk.Advance(10 * time.Millisecond)
		err := list()
		if round%3 == 0 {
			if err != nil {
				t.Fatalf("round %d: a listing on the one request its budget had: %v", round, err)
			}
			answered++
			continue
		}
		wantLimit(t, "a listing while the budget refills the last one's price", err, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
	}
	if reads := st.bigReads() - before; reads != answered || reads > rounds/3 {
		t.Fatalf("%d requests of the rogue's budget had its 2,049-node subtree read %d times and answered %d, want at most %d (three requests a read), each answered", rounds, reads, answered, rounds/3)
	}

	// Another lineage is not in the rogue's debt.
	other := register(t, srv.AdminClients(), "other")
	if err := listing(srv.Clients(other.Credential), other.Node.NodeId); err != nil {
		t.Fatalf("another lineage's listing: %v", err)
	}
	// Once its debt is refilled, the rogue lists again, at its price.
	clk.Advance(2 * bigBurst / 100 * time.Second)
	if err := list(); err != nil {
		t.Fatalf("the rogue's listing once its budget refilled: %v", err)
	}
}
