package grantstore

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestATerminationsRevocationReadsInThreeRequestsOnEtcd: revoking the
// grants a termination's nodes hold (RevokeHeldBy, the revocation step of
// every termination) read in five etcd requests one after the other: the
// holders' indexes, the grants, the feed's head, then in its transaction
// the grants, their children and the head, and after them the holders'
// nodes. The head is now read with the grants, and the holders' nodes
// with the grants' transaction reads: three requests. Every grant is still
// revoked, each with its tombstone.
func TestATerminationsRevocationReadsInThreeRequestsOnEtcd(t *testing.T) {
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	key, err := capability.NewSigningKey(nil, epoch, epoch)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(epoch)
	tr := &tree.Tree{Store: st, Clock: clk, Limits: tree.DefaultLimits}
	svc, err := New(Config{Store: st, Tree: agentTree{tr}, Clock: clk, Keys: func() capability.KeyRing { return capability.KeyRing{Keys: []capability.SigningKey{key}} }, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root, err := tr.RegisterRoot(ctx, "root", nil, "operator:alice")
	if err != nil {
		t.Fatal(err)
	}
	holders := []string{root.NodeID}
	for range 9 {
		child, err := tr.Spawn(ctx, root.NodeID, "child", nil, "operator:alice", func(*tree.Node) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, child.NodeID)
	}
	for _, h := range holders {
		if _, err := svc.IssueRoot(ctx, operator, RootRequest{HolderNodeID: h, Scopes: []string{"tools:read"}, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}

	before := st.Stats()
	held, err := svc.RevokeHeldBy(ctx, holders, "operator:sec", "terminated")
	if err != nil {
		t.Fatal(err)
	}
	if reads := st.Stats().ReadRequests - before.ReadRequests; reads > 3 {
		t.Errorf("revoking the grants of %d holders took %d read requests; want 3", len(holders), reads)
	}
	if len(held) != len(holders) {
		t.Fatalf("%d grants held, want %d", len(held), len(holders))
	}
	outcomes, err := svc.Outcomes(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range outcomes {
		if h.Outcome != capability.OutcomeRevoked {
			t.Errorf("grant %s of %s: outcome %q, want revoked", h.GrantID, h.NodeID, h.Outcome)
		}
	}
}
