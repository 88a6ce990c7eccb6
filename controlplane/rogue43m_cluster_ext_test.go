package controlplane_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
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
