package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The eleventh rogue pass: what the tenth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP/2, real JWTs,
// the manual clock).

// streamEnd waits for a server stream to end and returns its error; a
// stream still open at the guard fails the test (the guard is against a
// hang, not a timing).
func streamEnd(t *testing.T, what string, receive func() error) error {
	t.Helper()
	ended := make(chan error, 1)
	go func() {
		for {
			if err := receive(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s is still open", what)
		return nil
	}
}

// TestARogueThatClaimsItsOwnExitLosesItsOpenStreams: a rogue opens its
// revocation feed and a quiet lease channel, then claims its own exit
// (ConfirmExit by itself, not terminated). From then on it may not act: a
// new call with its credential is refused. But its open streams were ended
// only with its node's termination, and an exited node is not terminated
// until an operator stops it: the feed went on serving its lineage's
// revocations to a node that said it was gone. Each of its streams now
// ends, failed_precondition as a new call would, once its exit is
// confirmed.
func TestARogueThatClaimsItsOwnExitLosesItsOpenStreams(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)

	feed, err := rogue.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Close()
	if !feed.Receive() {
		t.Fatalf("the rogue's revocation feed: %v", feed.Err())
	}
	ch := rogue.Lease.Channel(ctx)
	defer ch.CloseResponse()
	defer ch.CloseRequest()
	if err := ch.Send(&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "job-none", LeaseId: "l_none", LeaseGeneration: 1, RenewSequence: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Receive(); err != nil {
		t.Fatalf("the rogue's channel: %v", err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's two streams to be counted", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 2
	})

	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId, Reason: "done"})); err != nil {
		t.Fatalf("the rogue's claim of its own exit: %v", err)
	}
	if err := whoAmI(rogue); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a new call after the rogue's exit: %v, want failed_precondition", err)
	}

	feedErr := streamEnd(t, "the exited rogue's revocation feed", func() error {
		if feed.Receive() {
			return nil
		}
		return feed.Err()
	})
	if connect.CodeOf(feedErr) != connect.CodeFailedPrecondition {
		t.Fatalf("the exited rogue's revocation feed ended with %v, want failed_precondition", feedErr)
	}
	chErr := streamEnd(t, "the exited rogue's quiet lease channel", func() error {
		_, err := ch.Receive()
		return err
	})
	if connect.CodeOf(chErr) != connect.CodeFailedPrecondition {
		t.Fatalf("the exited rogue's quiet lease channel ended with %v, want failed_precondition", chErr)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's stream slots to be given back", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 0
	})
}
