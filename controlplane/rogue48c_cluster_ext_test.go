package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-eighth hostile pass on the capability tree with several
// replicas: a rogue whose credential (or operator token) is revoked on
// replica A asks replica B, whose revocation feed follows etcd late (its
// watch open, delivering nothing for a while), for new nodes, each with a
// fresh credential of a line of its own that the revocation never named.

// TestRogue48CRevokedCredentialSpawnsNoChildOnAReplicaWhoseFeedLags: the
// rogue holding a worker's leaked credential talks to replica B. The
// security team revokes the credential by value on A; before B's feed has
// it, the rogue spawns a child under the worker on B, and a batch of two.
// B spawned them, each with a credential of its own line: once B's feed
// had caught up the leaked credential was refused everywhere, and the
// children's credentials served on A and B, and were refreshed by their
// sessions for as long as the worker ran: the revocation stopped nothing
// the rogue cared about. A spawn now reads the caller's token's record in
// its transaction (beside the parent's, one round trip on etcd): B
// refuses both, unauthenticated.
func TestRogue48CRevokedCredentialSpawnsNoChildOnAReplicaWhoseFeedLags(t *testing.T) {
	a, b, lagB := feedStallingPair(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	admin := a.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, a.Clients(root.Credential), root.Node.NodeId, "worker")
	node, leaked := worker.Node.NodeId, worker.Credential
	if err := whoAmI(b.Clients(leaked)); err != nil {
		t.Fatalf("the worker's first call through B: %v", err)
	}

	resume := revokeOnAWithBsFeedStalled(t, ctx, a, lagB, &tetherv1.RevokeTokenRequest{Token: leaked}, leaked, "credential")

	rogue := b.Clients(leaked)
	var (
		minted   []string
		refusals []error
	)
	one, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: node, Name: "stowaway"}))
	if err != nil {
		refusals = append(refusals, err)
	} else {
		minted = append(minted, one.Msg.Credential)
	}
	batch, err := rogue.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: node, Children: []*tetherv1.SpawnBatchChild{{Name: "stowaway-1"}, {Name: "stowaway-2"}}}))
	if err != nil {
		refusals = append(refusals, err)
	} else {
		for _, c := range batch.Msg.Spawned {
			minted = append(minted, c.Credential)
		}
	}
	t.Logf("on B, its feed behind, after A acknowledged the worker's credential's revocation: %d of 3 children spawned with credentials of their own", len(minted))
	if len(minted) != 0 {
		// What they are worth once B's feed has caught up.
		resume()
		testserver.WaitFor(t, 30*time.Second, "B's feed to hear the revocation", func() bool { return whoAmI(b.Clients(leaked)) != nil })
		served := 0
		for _, cred := range minted {
			if whoAmI(a.Clients(cred)) == nil && whoAmI(b.Clients(cred)) == nil {
				served++
			}
		}
		t.Fatalf("B spawned %d of 3 children for a credential whose revocation A had acknowledged, %d of their credentials served on A and B once B's feed had caught up; want none spawned", len(minted), served)
	}
	for _, err := range refusals {
		wantLimit(t, "a spawn asked of B with the revoked credential", err, connect.CodeUnauthenticated, "revoked")
	}
	// The worker's node was not stopped, only the credential revoked: an
	// honest credential spawns under its own node still (the planner's,
	// under the planner).
	spawn(t, b.Clients(root.Credential), root.Node.NodeId, "honest")
}

// TestRogue48CRevokedOperatorTokenRegistersNoRootOnAReplicaWhoseFeedLags:
// a rogue holding a leaked operator token talks to replica B. The
// security team revokes it on A; before B's feed has it, the rogue
// registers a root agent on B. B registered it, with a credential of its
// own line: a tree the revocation never named, its credential served on A
// and B once B's feed had caught up and refreshed by its session for as
// long as it ran; and it issued a running agent a root grant. RegisterRoot
// and IssueRoot now read the caller's token's record in their
// transactions: B refuses both, unauthenticated.
func TestRogue48CRevokedOperatorTokenRegistersNoRootOnAReplicaWhoseFeedLags(t *testing.T) {
	a, b, lagB := feedStallingPair(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	adminA := a.AdminClients()
	leaked, err := adminA.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Subject: "launcher", Role: tetherv1.Role_ROLE_OPERATOR, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if err := whoAmI(b.Clients(leaked.Msg.Token)); err != nil {
		t.Fatalf("the operator token's first call through B: %v", err)
	}
	worker := register(t, adminA, "worker")

	resume := revokeOnAWithBsFeedStalled(t, ctx, a, lagB, &tetherv1.RevokeTokenRequest{TokenId: leaked.Msg.TokenId}, leaked.Msg.Token, "operator token")

	got, err := b.Clients(leaked.Msg.Token).Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "stowaway"}))
	if err == nil {
		resume()
		testserver.WaitFor(t, 30*time.Second, "B's feed to hear the revocation", func() bool { return whoAmI(b.Clients(leaked.Msg.Token)) != nil })
		cred := got.Msg.Credential
		served := whoAmI(a.Clients(cred)) == nil && whoAmI(b.Clients(cred)) == nil
		t.Fatalf("B registered root %s for an operator token whose revocation A had acknowledged, its credential served on A and B once B's feed had caught up: %v; want none registered", got.Msg.Node.NodeId, served)
	}
	wantLimit(t, "a root registered on B with the revoked operator token", err, connect.CodeUnauthenticated, "revoked")
	// Nor does it issue a root grant there to a running agent (a grant the
	// revocation never named, refreshed by its holder).
	issued, err := b.Clients(leaked.Msg.Token).Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: worker.Node.NodeId, Scopes: []string{"files:*"}, Ttl: durationpb.New(time.Hour)}))
	if err == nil {
		t.Fatalf("B issued root grant %s for an operator token whose revocation A had acknowledged; want none issued", issued.Msg.Grant.GrantId)
	}
	wantLimit(t, "a root grant issued on B with the revoked operator token", err, connect.CodeUnauthenticated, "revoked")
	// The admin's own token registers roots on B still.
	register(t, b.AdminClients(), "honest")
}

// TestRogue48CSpawnsCostOfTheCallersRecordOnEtcd measures what reading the
// caller's token's record costs a spawn, a root's registration and a
// delegation on etcd, by the store's counters, over 20 of each: an
// agent's spawn (the hot path) and delegation expect its credential's
// record absent, a comparison in the commit and no read; an operator's
// spawn reads the record beside the parent's keys, a range more in the
// same request; a root's registration read nothing before, and reads the
// operator's record now.
func TestRogue48CSpawnsCostOfTheCallersRecordOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the etcd servers; make test and CI run them.")
	}
	cluster := etcdtest.Start(t)
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = etcdtest.Prefix(t) })
	srv := testserver.Start(t, testserver.WithEtcdStore(st, "replica-0"), testserver.WithClock(clock.NewManual(epoch)))
	ctx := context.Background()
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	agent := srv.Clients(root.Credential)
	const n = 20
	type cost struct{ requests, ranges, compares float64 }
	measure := func(what string, fn func(i int) error) cost {
		t.Helper()
		if err := fn(-1); err != nil { // warms what is kept between calls
			t.Fatalf("%s: %v", what, err)
		}
		before := st.Stats()
		for i := range n {
			if err := fn(i); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		after := st.Stats()
		c := cost{
			requests: float64(after.ReadRequests-before.ReadRequests) / n,
			ranges:   float64(after.Ranges-before.Ranges) / n,
			compares: float64(after.Compares-before.Compares) / n,
		}
		t.Logf("%s: %.2f read requests, %.2f ranges, %.2f comparisons each", what, c.requests, c.ranges, c.compares)
		return c
	}
	spawnAs := func(c *testserver.Clients, name string) func(int) error {
		return func(i int) error {
			_, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Node.NodeId, Name: fmt.Sprintf("%s-%d", name, i+1)}))
			return err
		}
	}
	agentSpawn := measure("an agent's spawn", spawnAs(agent, "by-agent"))
	operatorSpawn := measure("an operator's spawn", spawnAs(admin, "by-operator"))
	rootReg := measure("a root's registration", func(i int) error {
		_, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: fmt.Sprintf("root-%d", i+1)}))
		return err
	})
	planners := issueRoot(t, admin, root.Node.NodeId, time.Hour, "files:*")
	child := spawn(t, agent, root.Node.NodeId, "delegate-holder")
	agentDelegation := measure("an agent's delegation", func(int) error {
		_, err := agent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: planners.grant.GrantId, HolderNodeId: child.Node.NodeId, Scopes: []string{"files:*"}}))
		return err
	})
	// Before the pass (the same measure): an agent's spawn 4.2 to 4.45 read
	// requests, 5.25 to 5.55 ranges and 4 comparisons, an operator's 3, 4
	// and 4.1, a root's registration none, an agent's delegation 12, 13
	// and 16.5; after it, an agent's spawn and delegation a comparison
	// more, an operator's spawn a range and a comparison more (in the
	// same request), a root's registration a request of one range. A separate read of the record (as mintableBy's)
	// would be a request more each.
	if agentSpawn.requests >= 4.8 || agentSpawn.ranges >= 5.8 {
		t.Errorf("an agent's spawn took %.2f read requests and %.2f ranges; want no read more than before the pass (4.3 and 5.3): its credential's record is compared at the commit, not read", agentSpawn.requests, agentSpawn.ranges)
	}
	if operatorSpawn.requests >= 3.5 {
		t.Errorf("an operator's spawn took %.2f read requests; want no request more than before the pass (3): its token's record is read with the parent's keys", operatorSpawn.requests)
	}
	if agentDelegation.requests >= 12.5 {
		t.Errorf("an agent's delegation took %.2f read requests; want no read more than before the pass (12): its credential's record is compared at the commit, not read", agentDelegation.requests)
	}
	if rootReg.requests > 1 {
		t.Errorf("a root's registration took %.2f read requests; want 1 at most (its operator's token's record)", rootReg.requests)
	}
}

// TestRogue48CRevokedCredentialDelegatesNoGrantOnAReplicaWhoseFeedLags:
// the rogue holding a worker's leaked credential spawned a child of its
// own before the theft was found (a credential of its own line, which
// revoking the worker's by value does not reach: stop the node for that).
// The security team revokes the worker's credential by value on A; before
// B's feed has it, the rogue asks B to delegate the worker's grant to its
// child. B delegated it: the child, which held no grant, held the
// worker's authority once B's feed had caught up, refreshing its token
// on A and B for as long as the grant lived. A delegation now reads the
// caller's token's record in the grant's transaction: B refuses,
// unauthenticated.
func TestRogue48CRevokedCredentialDelegatesNoGrantOnAReplicaWhoseFeedLags(t *testing.T) {
	a, b, lagB := feedStallingPair(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	admin := a.AdminClients()
	root := register(t, admin, "planner")
	worker := spawn(t, a.Clients(root.Credential), root.Node.NodeId, "worker")
	grant := issueRoot(t, admin, worker.Node.NodeId, time.Hour, "files:*")
	leaked := worker.Credential
	stowaway := spawn(t, b.Clients(leaked), worker.Node.NodeId, "stowaway")

	resume := revokeOnAWithBsFeedStalled(t, ctx, a, lagB, &tetherv1.RevokeTokenRequest{Token: leaked}, leaked, "credential")

	got, err := b.Clients(leaked).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: grant.grant.GrantId, HolderNodeId: stowaway.Node.NodeId, Scopes: []string{"files:*"}}))
	if err == nil {
		resume()
		testserver.WaitFor(t, 30*time.Second, "B's feed to hear the revocation", func() bool { return whoAmI(b.Clients(leaked)) != nil })
		refreshed := 0
		for _, srv := range []*testserver.Server{a, b} {
			if _, err := srv.Clients(stowaway.Credential).Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: got.Msg.Grant.GrantId})); err == nil {
				refreshed++
			}
		}
		t.Fatalf("B delegated the worker's grant to the rogue's child %s for a credential whose revocation A had acknowledged; once B's feed had caught up the child refreshed its token on %d of 2 replicas; want none delegated", stowaway.Node.NodeId, refreshed)
	}
	wantLimit(t, "a delegation asked of B with the revoked credential", err, connect.CodeUnauthenticated, "revoked")
	// The planner's honest credential delegates on B still.
	planners := issueRoot(t, admin, root.Node.NodeId, time.Hour, "files:*")
	delegate(t, b.Clients(root.Credential), planners, worker.Node.NodeId, "files:*")
}
