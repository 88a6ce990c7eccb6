package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The eighteenth hostile pass: a client stream's messages.
//
// TestARogueCannotBuyTheDecodingOfALargeStreamMessageForOneRequest: a
// unary request's body was priced by its size before it was decoded, but
// a message of a client stream (the agent Session, the lease Channel) cost
// one request whatever its size up to --max-request-bytes: a heartbeat
// carrying 1 MiB of unknown fields took 18–21 ms of CPU to decode, about
// fifty small calls' worth, for one request of the lineage's budget. A
// stream's message is now priced by the length its envelope carries, as it
// arrives and before its bytes are decoded (a heartbeat of the Session,
// a message of the Channel): past its first 4 KiB, one
// request per 4 KiB (controlplane.BodyBytesPerRequest), charged where its
// message is (the lineage's budget, then the node's upkeep reserve).
func TestARogueCannotBuyTheDecodingOfALargeStreamMessageForOneRequest(t *testing.T) {
	const rate = 50 // bursts of 100: less than a 1 MiB message's price
	const burst = 2 * rate
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit = rate })
	ctx := context.Background()

	// heartbeats runs a session of agent on node, sending heartbeats of
	// about size bytes of unknown fields each (0: ordinary ones) until the
	// stream ends or max are answered; it returns how many were answered
	// and how the stream ended.
	heartbeats := func(clients *testserver.Clients, node string, size, max int) (int, error) {
		t.Helper()
		var unknown []byte
		for len(unknown) < size {
			unknown = protowire.AppendTag(unknown, 1000, protowire.VarintType)
			unknown = protowire.AppendVarint(unknown, 0)
		}
		session := clients.Agent.Session(ctx)
		defer func() { _ = session.CloseRequest(); _ = session.CloseResponse() }()
		if err := session.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: node}}}); err != nil {
			t.Fatal(err)
		}
		acks := 0
		for acks < max {
			hb := &tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}
			hb.ProtoReflect().SetUnknown(unknown)
			_ = session.Send(hb)
			for {
				m, err := session.Receive()
				if err != nil {
					return acks, err
				}
				if m.GetHeartbeatAck() != nil {
					acks++
					break
				}
			}
		}
		return acks, nil
	}

	rogue := register(t, srv.AdminClients(), "rogue")
	rogueC := srv.Clients(rogue.Credential)
	// Before, each heartbeat of 1 MiB cost one request: the rogue had its
	// lineage's burst and its node's reserve of them decoded (115).
	acks, err := heartbeats(rogueC, rogue.Node.NodeId, 1<<20-64, 50)
	if acks != 0 {
		t.Fatalf("%d heartbeats of 1 MiB answered for a lineage with a burst of %d requests, want none", acks, burst)
	}
	wantLimit(t, "a heartbeat of 1 MiB of unknown fields", err, connect.CodeResourceExhausted,
		"a stream's message costs a request per 4096 bytes", "lineage "+rogue.Node.NodeId)
	// The budget went on the message's price: the rogue's next call waits.
	wantLimit(t, "the rogue's next call", whoAmI(rogueC), connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId)

	// So is a message of the lease Channel, before it is judged.
	clk.Advance(time.Minute)
	channel := rogueC.Lease.Channel(ctx)
	big := &tetherv1.ChannelRequest{CorrelationId: 1}
	var unknown []byte
	for len(unknown) < 1<<20-64 {
		unknown = protowire.AppendTag(unknown, 1000, protowire.VarintType)
		unknown = protowire.AppendVarint(unknown, 0)
	}
	big.ProtoReflect().SetUnknown(unknown)
	_ = channel.Send(big)
	answer, err := channel.Receive()
	_ = channel.CloseRequest()
	_ = channel.CloseResponse()
	if err == nil {
		t.Fatalf("a Channel message of 1 MiB of unknown fields was judged: %v", answer)
	}
	wantLimit(t, "a Channel message of 1 MiB of unknown fields", err, connect.CodeResourceExhausted,
		"a stream's message costs a request per 4096 bytes", "lineage "+rogue.Node.NodeId)

	// The price is the budget, not a ban: heartbeats of about 8 KiB cost two
	// requests each (the message and its second 4 KiB).
	clk.Advance(time.Minute)
	acks, err = heartbeats(rogueC, rogue.Node.NodeId, 8<<10-64, 200)
	if want := (burst - 1 + controlplane.UpkeepReserveBurst) / 2; acks != want {
		t.Fatalf("%d heartbeats of 8 KiB answered (%v), want %d (the burst less the session's opening, then the node's reserve, two requests each)", acks, err, want)
	}
	wantLimit(t, "a heartbeat of 8 KiB past the budget", err, connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId)

	// An honest agent's ordinary heartbeats cost what they did: one
	// request each, the lineage's burst and then its node's reserve.
	honest := register(t, srv.AdminClients(), "honest")
	acks, err = heartbeats(srv.Clients(honest.Credential), honest.Node.NodeId, 0, 200)
	if want := burst - 1 + controlplane.UpkeepReserveBurst; acks != want {
		t.Fatalf("%d ordinary heartbeats answered (%v), want %d (the burst less the session's opening, then the node's reserve)", acks, err, want)
	}
	wantLimit(t, "an ordinary heartbeat past the budget", err, connect.CodeResourceExhausted, "rate limit", "lineage "+honest.Node.NodeId)
}
