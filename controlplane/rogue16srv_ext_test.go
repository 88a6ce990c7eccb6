package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixteenth hostile pass on the server's resources.
//
// TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel:
// a lineage's open streams are bounded together (--max-streams-per-lineage)
// and each node had a reserve of its own for its signal streams only, so
// one member could hold the whole share and keep every sibling's other
// streams out: an honest sibling's lease Channel, on which it acks and
// renews the jobs it holds, was refused resource_exhausted until the rogue
// closed some. Each node now also has a small reserve of its own for
// streams of other kinds (controlplane.StreamReserve), which a stream
// takes from first: the sibling opens its Channel and a watch, and works
// its lease over the Channel; a third stream past its reserve is refused
// (the share is still held), and the lineage holds no more than its share
// and its nodes' reserves, however many of its members open streams.

// TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel:
// see the file's header.
func TestARogueMemberHoldingItsLineagesStreamsCannotKeepASiblingFromItsLeaseChannel(t *testing.T) {
	const perCaller, share = 12, 4
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.Conn.MaxStreamsPerCaller = perCaller
		cfg.Conn.MaxStreamsPerLineage = share
	})
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	rootC := srv.Clients(root.Credential)
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogueC, honestC := srv.Clients(rogue.Credential), srv.Clients(honest.Credential)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	// revocations opens a revocation feed and waits for the server's
	// first message, which says it was admitted.
	revocations := func(c *testserver.Clients) error {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.Capability.WatchRevocations(sctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err == nil && !stream.Receive() {
			err = stream.Err()
		}
		if err != nil {
			scancel()
			return err
		}
		closers = append(closers, func() { scancel(); _ = stream.Close() })
		return nil
	}
	refused := func(what string, err error, node string) {
		t.Helper()
		wantLimit(t, what, err, connect.CodeResourceExhausted, "lineage "+root.Node.NodeId, "--max-streams-per-lineage")
		if node != honest.Node.NodeId && strings.Contains(err.Error(), honest.Node.NodeId) {
			t.Fatalf("%s: the refusal %q names the honest sibling, a node the caller did not ask about", what, err)
		}
	}

	// The rogue opens feeds up to its own cap: its reserve and the whole
	// share are admitted, the rest refused.
	held := 0
	for range perCaller {
		if err := revocations(rogueC); err != nil {
			refused("a rogue's feed past its lineage's share", err, rogue.Node.NodeId)
			continue
		}
		held++
	}

	// The honest sibling works the job it holds over its lease Channel.
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-honest", HolderIdentity: honest.Node.NodeId,
		LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	ch := openChannel(t, honestC)
	l, d, errText := ch.tryOpen(ack(offered.Msg.Lease))
	if errText != "" {
		t.Fatalf("the honest sibling's lease Channel, its lineage's share held by the rogue: %s", errText)
	}
	wantDecision(t, "the sibling's ACK on its Channel", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	clk.Advance(10 * time.Second)
	_, d, errText = ch.tryOpen(renew(l, 1))
	if errText != "" {
		t.Fatalf("the sibling's renewal on its Channel: %s", errText)
	}
	wantDecision(t, "the sibling's renewal on its Channel", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	if want := share + controlplane.StreamReserve; held != want {
		t.Fatalf("the rogue holds %d feeds, want its lineage's share of %d and its node's reserve of %d", held, share, controlplane.StreamReserve)
	}
	// And a watch beside it; a third stream is past its reserve.
	if err := revocations(honestC); err != nil {
		t.Fatalf("the sibling's second stream, within its node's reserve: %v", err)
	}
	refused("the sibling's third stream, past its node's reserve with the share held", revocations(honestC), honest.Node.NodeId)

	// A swarm holds its share and its nodes' reserves, no more: the root
	// too opens what it can.
	for range perCaller {
		if err := revocations(rootC); err != nil {
			refused("the root's feed past its lineage's share", err, root.Node.NodeId)
		}
	}
	if got, want := srv.OpenLineageStreams(root.Node.NodeId), share+3*controlplane.StreamReserve; got != want {
		t.Fatalf("the lineage holds %d open streams, want its share and its 3 nodes' reserves, %d", got, want)
	}
	// The signal streams keep their own reserve beside the other one.
	if _, err := openSession(t, honestC, honest.Node.NodeId); err != nil {
		t.Fatalf("the sibling's session beside its Channel and its watch: %v", err)
	}
}

// tryOpen sends m on a Channel that may be refused as it opens: the
// refusal comes back as the error text, not a fatal error.
func (c *channel) tryOpen(m *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, string) {
	c.next++
	m.CorrelationId = c.next
	if err := c.stream.Send(m); err != nil {
		if _, rerr := c.stream.Receive(); rerr != nil {
			return nil, nil, rerr.Error()
		}
		return nil, nil, err.Error()
	}
	resp, err := c.stream.Receive()
	if err != nil {
		return nil, nil, err.Error()
	}
	return resp.Lease, resp.Decision, resp.Error
}
