package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAnExpiredTokensStreamEndsOnTimeWhenTheClockMovesAsItArms: an open
// stream's end at its token's expiry was armed for the time left until
// then as the interceptor had read the clock, from what the clock read
// when it armed: a clock moved in between (in a test, an Advance just
// after the stream was counted open, as TestAnExpiredTokenLosesItsOpenStreams
// does) armed it late by the move, and the expired token's stream went on
// serving. It is armed for the expiry itself (clock.AfterFuncAt).
func TestAnExpiredTokensStreamEndsOnTimeWhenTheClockMovesAsItArms(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	gate, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "gate-1", Ttl: durationpb.New(20 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	expiry := gate.Msg.ExpiresAt.AsTime()
	armed := clk.JumpAsNextFuncArms(10 * time.Minute) // as the stream arms its end
	cancels, err := srv.Clients(gate.Msg.Token).Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cancels.Close()
	select {
	case <-armed:
	case <-ctx.Done():
		t.Fatal("the stream never armed its end")
	}
	// Refused from its expiry plus the leeway on, like a call.
	clk.Set(expiry.Add(auth.Leeway))
	for cancels.Receive() {
	}
	wantLimit(t, "the expired gate's open WatchCancels", cancels.Err(), connect.CodeUnauthenticated, "expired", "the stream is over")
}
