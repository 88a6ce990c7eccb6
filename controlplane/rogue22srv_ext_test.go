package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// nodeReadCountingStore is the server's real Badger store, counting the
// reads of the nodes it is told to watch (their key, by Get, in a View or
// an Update).
type nodeReadCountingStore struct {
	store.Store
	mu      sync.Mutex
	watched map[string]bool
	reads   atomic.Int64
}

type nodeReadCountingRead struct {
	store.ReadTxn
	s *nodeReadCountingStore
}

type nodeReadCountingTxn struct {
	store.Txn
	s *nodeReadCountingStore
}

func (s *nodeReadCountingStore) watch(nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watched == nil {
		s.watched = map[string]bool{}
	}
	s.watched[string(tree.NodeKey(nodeID))] = true
}

func (s *nodeReadCountingStore) count(key []byte) {
	s.mu.Lock()
	watched := s.watched[string(key)]
	s.mu.Unlock()
	if watched {
		s.reads.Add(1)
	}
}

func (r nodeReadCountingRead) Get(key []byte) ([]byte, error) {
	r.s.count(key)
	return r.ReadTxn.Get(key)
}

func (r nodeReadCountingTxn) Get(key []byte) ([]byte, error) {
	r.s.count(key)
	return r.Txn.Get(key)
}

func (s *nodeReadCountingStore) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(nodeReadCountingRead{tx, s}) })
}

func (s *nodeReadCountingStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error { return fn(nodeReadCountingTxn{tx, s}) })
}

// TestADeadCredentialsRefusalsSpendItsAddresssBudget: a credential that
// verifies but is dead — the token of a terminated node, of a node whose
// exit was confirmed, an operator token that was revoked — was refused
// without costing any budget (it has no principal that may act, and the
// address's budget for requests without a valid credential was charged
// only for tokens that did not verify), and each refusal read the node (an
// exited node's in a read-write transaction, noting the contradiction):
// 50 of 50 refusals answered, 50 node reads, as fast as the rogue sent.
// Such refusals now cost the calling address's budget for requests
// without a valid credential, and once it is spent the credential is
// refused before any read. (Fails if more than the burst of refusals is
// answered, or the node is read more than the burst's times.)
func TestADeadCredentialsRefusalsSpendItsAddresssBudget(t *testing.T) {
	const burst = 2 // AnonymousRateLimit 1: bursts of 2
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &nodeReadCountingStore{Store: b}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.Store = st
		cfg.AnonymousRateLimit = 1
	})
	admin := srv.AdminClients()
	bg := context.Background()

	// flood sends 50 calls with a dead credential and returns how many
	// were answered with its refusal (rather than resource-exhausted) and
	// how many times the node was read meanwhile.
	flood := func(t *testing.T, c *testserver.Clients, node string, want connect.Code) (answered int, reads int64) {
		t.Helper()
		st.reads.Store(0)
		for range 50 {
			_, err := c.Agent.GetNode(bg, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: node}))
			switch connect.CodeOf(err) {
			case want:
				answered++
			case connect.CodeResourceExhausted:
				if !strings.Contains(err.Error(), "without a valid credential") {
					t.Fatalf("refusal past the budget does not name its budget: %v", err)
				}
			default:
				t.Fatalf("a call with a dead credential: %v, want %v or resource_exhausted", err, want)
			}
		}
		t.Logf("%d of 50 calls answered %v, %d node reads", answered, want, st.reads.Load())
		return answered, st.reads.Load()
	}
	// Each case spends the budget; the next starts from a full one (a
	// fresh credential's first call, not yet verified, is refused too
	// while it is spent).
	refill := func() { clk.Advance(time.Minute) }

	parent := register(t, admin, "parent")
	parentC := srv.Clients(parent.Credential)

	t.Run("terminated", func(t *testing.T) {
		refill()
		child := spawn(t, parentC, parent.Node.NodeId, "stopped")
		childC := srv.Clients(child.Credential)
		if _, err := childC.Agent.GetNode(bg, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.Node.NodeId})); err != nil {
			t.Fatal(err) // its token verified and cached while it lived
		}
		stopChild(t, srv, parentC, child.Node.NodeId)
		st.watch(child.Node.NodeId)
		answered, reads := flood(t, childC, child.Node.NodeId, connect.CodeUnauthenticated)
		if answered > burst || reads > burst {
			t.Errorf("a terminated node's credential: %d of 50 calls answered unauthenticated, %d node reads; want at most the burst (%d) of each, the rest refused before any read", answered, reads, burst)
		}
	})

	t.Run("exited", func(t *testing.T) {
		refill()
		child := spawn(t, parentC, parent.Node.NodeId, "gone")
		childC := srv.Clients(child.Credential)
		if _, err := childC.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId, Reason: "done"})); err != nil {
			t.Fatal(err)
		}
		st.watch(child.Node.NodeId)
		answered, reads := flood(t, childC, child.Node.NodeId, connect.CodeFailedPrecondition)
		if answered > burst || reads > 2*burst {
			t.Errorf("an exited node's credential: %d of 50 calls answered failed_precondition, %d node reads; want at most the burst (%d) answered, two reads each (its read and its read-write transaction), the rest refused before any read", answered, reads, burst)
		}
	})

	t.Run("revoked", func(t *testing.T) {
		refill()
		tok := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "leaver", time.Hour)
		c := srv.Clients(tok.Token)
		if _, err := c.Agent.GetNode(bg, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: parent.Node.NodeId})); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Auth.RevokeToken(bg, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: tok.TokenId, Reason: "left"})); err != nil {
			t.Fatal(err)
		}
		answered, _ := flood(t, c, parent.Node.NodeId, connect.CodeUnauthenticated)
		if answered > burst {
			t.Errorf("a revoked token: %d of 50 calls answered unauthenticated; want at most the burst (%d), the rest refused resource-exhausted", answered, burst)
		}
	})

	// The budget spent is the dead credentials' address's for requests
	// without a valid credential: a live agent's calls from the same
	// address go on.
	if _, err := parentC.Agent.GetNode(bg, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: parent.Node.NodeId})); err != nil {
		t.Errorf("the live parent, after its dead children's floods: %v", err)
	}
}

// TestARogueCannotGrowANodesGrantsWithoutBound: a node could hold any
// number of grants. An agent delegating to its child without end, or
// revoking what it delegated and delegating again, grew the store, every
// listing of the node's grants and every bulk revocation of them (and an
// operator's roots did the same): 8 delegations, then 8 rounds of
// revoking (or letting expire) and 8 more, left the sink holding 72
// grants. A node now holds at most --grant-max-per-node live grants
// delegated by agents, and as many issued by operators, a delegation past
// it refused resource-exhausted; each new grant drops its holder's oldest
// dead ones (revoked or expired) past as many again, except one another
// grant derives from, so no chain breaks. (Fails if a delegation past the
// bound is accepted, if the sink keeps more than the bound of dead grants
// beside its live ones, or if any grant names an ancestor that is gone.)
func TestARogueCannotGrowANodesGrantsWithoutBound(t *testing.T) {
	const limit = 8
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.GrantMaxPerNode = limit })
	admin := srv.AdminClients()
	bg := context.Background()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	root := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	sink := spawn(t, rc, rogue.Node.NodeId, "sink")
	sinkC := srv.Clients(sink.Credential)
	grand := spawn(t, sinkC, sink.Node.NodeId, "grand")

	overBound := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--grant-max-per-node") {
			t.Fatalf("%s past the bound of %d: %v, want resource_exhausted naming --grant-max-per-node", what, limit, err)
		}
	}
	delegateToSink := func(ttl time.Duration) error {
		_, err := rc.Capability.Delegate(bg, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: root.grant.GrantId, HolderNodeId: sink.Node.NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(ttl)}))
		return err
	}

	var first held
	for i := range limit {
		g := delegateFor(t, rc, root, sink.Node.NodeId, 30*time.Minute, "tool:http")
		if i == 0 {
			first = g
		}
	}
	overBound("a delegation", delegateToSink(30*time.Minute))
	if n := len(allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: sink.Node.NodeId})); n != limit {
		t.Fatalf("after the refused delegation the sink holds %d grants, want %d: a refusal changes nothing", n, limit)
	}

	// The sink passes its first grant on: revoked, that grant is dead but
	// another derives from it.
	kept := delegate(t, sinkC, first, grand.Node.NodeId, "tool:http")

	// Churn: revoke what the sink was delegated (or let it expire) and
	// delegate again.
	for round := range 8 {
		if round%2 == 0 {
			if _, err := rc.Capability.Revoke(bg, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: sink.Node.NodeId}, Reason: "churn"})); err != nil {
				t.Fatal(err)
			}
		} else {
			clk.Advance(2 * time.Minute)
		}
		for i := range limit {
			if err := delegateToSink(time.Minute); err != nil {
				t.Fatalf("round %d, delegation %d, its earlier grants dead: %v", round, i, err)
			}
		}
	}
	var agents, dead int
	for _, g := range allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: sink.Node.NodeId}) {
		if strings.HasPrefix(g.Issuer, "agent:") {
			agents++
			if g.State != tetherv1.GrantState_GRANT_STATE_ACTIVE {
				dead++
			}
		}
	}
	t.Logf("the sink holds %d grants delegated by agents, %d of them dead", agents, dead)
	// Its live ones, as many dead, and the first (another derives from it).
	if agents > 2*limit+1 {
		t.Errorf("after 8 rounds of %d delegations the sink holds %d grants delegated by agents (%d dead), want at most %d: its live ones and as many dead", limit, agents, dead, 2*limit+1)
	}
	// No chain is broken: every grant's ancestors are stored.
	all := allGrants(t, admin, &tetherv1.ListGrantsRequest{})
	stored := map[string]bool{}
	for _, g := range all {
		stored[g.GrantId] = true
	}
	for _, g := range all {
		for _, a := range g.Chain {
			if !stored[a] {
				t.Errorf("grant %s names ancestor %s, which was dropped", g.GrantId, a)
			}
		}
	}
	if !stored[first.grant.GrantId] {
		t.Errorf("the sink's first grant, from which %s derives, was dropped", kept.grant.GrantId)
	}
	if got := getGrant(t, admin, kept.grant.GrantId); got.State != tetherv1.GrantState_GRANT_STATE_REVOKED {
		t.Errorf("the grandchild's grant, derived from a revoked one, is %v", got.State)
	}

	// The roots operators issue count apart: the sink's live delegations
	// do not keep an operator from issuing it as many.
	for range limit {
		issueRoot(t, admin, sink.Node.NodeId, time.Hour, "tool:x")
	}
	_, err := admin.Capability.IssueRoot(bg, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: sink.Node.NodeId, Scopes: []string{"tool:x"}, Ttl: durationpb.New(time.Hour)}))
	overBound("a root", err)
}
