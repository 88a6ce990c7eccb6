package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A rogue that sets the replicas' "already forwarded" mark
// (Tether-Forwarded-By) on its own job-lease calls to a follower — unary
// calls and a Channel — is refused Unavailable at once by that follower,
// which knows another replica leads: the mark is not authenticated, and
// the follower no longer holds each such call up to its route wait (5 s)
// for a leadership it has no reason to expect. Its calls are still judged
// nowhere, and the same calls without the mark are forwarded and judged
// by the leader as before.
func TestRogue43MAForgedForwardedMarkIsRefusedAtOnceByAFollower(t *testing.T) {
	replicas, lead, election := startReplicas(t, 3)
	follower := followersOf(replicas, lead)[0]
	ctx := context.Background()
	admin := lead.AdminClients()
	rogue := register(t, admin, "rogue")
	worker := spawn(t, admin, rogue.Node.NodeId, "rogue-worker")
	leaderNow, err := election.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The follower knows the leader: the rogue's own call, unmarked, is
	// forwarded and answered.
	testserver.WaitFor(t, replicaWait, "the follower to forward to the leader", func() bool {
		_, err := follower.Clients(worker.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: worker.Node.NodeId}))
		return err == nil
	})

	marked := testserver.NewClients(follower.HTTP, follower.URL, worker.Credential, withHeaders(http.Header{"Tether-Forwarded-By": {leaderNow.Identity}}))
	const calls = 4
	errs := make([]error, calls+1)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = marked.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: worker.Node.NodeId}))
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		stream := follower.Clients(worker.Credential).Lease.Channel(ctx)
		stream.RequestHeader().Set("Tether-Forwarded-By", leaderNow.Identity)
		defer stream.CloseResponse()
		_ = stream.Send(&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "none", LeaseId: "none", LeaseGeneration: 1, RenewSequence: 1}}})
		_, errs[calls] = stream.Receive()
	}()
	wg.Wait()
	held := 0
	for i, err := range errs {
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("marked call %d through the follower: %v, want unavailable (judged nowhere)", i, err)
			continue
		}
		if !strings.Contains(err.Error(), "marked as already forwarded") {
			held++
			t.Errorf("marked call %d through the follower was held for a leadership it had no reason to expect: %v", i, err)
		}
	}
	if held > 0 {
		t.Errorf("%d of %d marked calls held by the follower, want 0", held, len(errs))
	}
	// Unmarked, the same rogue's calls still go to the leader.
	if _, err := follower.Clients(worker.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: worker.Node.NodeId})); err != nil {
		t.Fatalf("an unmarked call through the follower: %v", err)
	}
}

// startReplicasWith is startReplicas with options for every replica.
func startReplicasWith(t *testing.T, n int, opts ...testserver.Option) (replicas []*testserver.Server, lead *testserver.Server) {
	t.Helper()
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	byID := map[string]*testserver.Server{}
	for i := range n {
		id := fmt.Sprintf("replica-%d", i)
		st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
		srv := testserver.Start(t, append([]testserver.Option{testserver.WithEtcdStore(st, id)}, opts...)...)
		replicas = append(replicas, srv)
		byID[id] = srv
	}
	election := electionOf(t, cluster, prefix)
	testserver.WaitFor(t, replicaWait, "a replica to lead and serve the leases", func() bool {
		c, err := election.Current(context.Background())
		if err != nil {
			return false
		}
		lead = byID[c.Identity]
		serving, _ := lead.Leases().Serving()
		return serving
	})
	return replicas, lead
}

// lineageShareCluster starts three replicas whose leader admits share
// connections per lineage, and returns the leader and a follower.
func lineageShareCluster(t *testing.T, share int) (lead, follower *testserver.Server) {
	t.Helper()
	replicas, lead := startReplicasWith(t, 3, func(cfg *controlplane.Config) {
		cfg.Conn.MaxConnectionsPerLineage = share
	})
	return lead, followersOf(replicas, lead)[0]
}

// A rogue lineage that holds its share of connections to the leader and
// sends a job-lease call through a follower has that call refused
// resource_exhausted on the leader — and the follower's connection to the
// leader, which carries every other agent's forwarded calls, used to be
// closed with it (GOAWAY). Each such call made the follower open a new
// connection for the calls that followed, while the streams of honest
// agents kept the old ones open and counted against their lineages: after
// two of the rogue's calls an honest lineage holding two lease Channels
// through the follower could open no third (its share, 2, spent on
// connections it never chose). The leader now refuses the rogue's
// forwarded call alone and keeps the shared connection.
func TestRogue43MBRogueAtItsShareCannotCloseAFollowersConnection(t *testing.T) {
	const share = 2
	lead, follower := lineageShareCluster(t, share)
	ctx := context.Background()
	admin := lead.AdminClients()
	honest := register(t, admin, "honest")
	rogue := register(t, admin, "rogue")
	testserver.WaitFor(t, replicaWait, "the follower to forward to the leader", func() bool {
		_, err := follower.Clients(honest.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: honest.Node.NodeId}))
		return err == nil
	})
	// The rogue holds its share of connections to the leader.
	for range share {
		if _, err := testserver.NewClients(testserver.H2CClient(), lead.URL, rogue.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: rogue.Node.NodeId})); err != nil {
			t.Fatal(err)
		}
	}
	openChannel := func(i int) error {
		stream := follower.Clients(honest.Credential).Lease.Channel(ctx)
		t.Cleanup(func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() })
		_, err := channelRenew(stream, &tetherv1.Lease{JobId: fmt.Sprintf("none-%d", i), LeaseId: "none", LeaseGeneration: 1}, 1)
		return err
	}
	refused := 0
	for i := range share + 1 {
		if err := openChannel(i); err != nil {
			refused++
			t.Errorf("the honest lineage's Channel %d through the follower: %v", i, err)
		}
		if i == share {
			break
		}
		_, err := follower.Clients(rogue.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: rogue.Node.NodeId}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("the rogue's call through the follower, at its share on the leader: %v, want resource_exhausted", err)
		}
	}
	if refused > 0 {
		t.Errorf("%d of the honest lineage's %d Channels through the follower refused, want 0", refused, share+1)
	}
}
