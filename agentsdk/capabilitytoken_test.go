package agentsdk_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A grant outlives its tokens: the token source refreshes once a third of
// a token's life is left, keeps working for as long as the grant, and says
// so when the grant is revoked.
func TestCapabilityTokenRefreshesForTheGrantsLifetime(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	me, err := agentsdk.RegisterRoot(ctx, admin, "planner", nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: me.NodeID(), Scopes: []string{"tool:echo"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	grantID := root.Msg.Grant.GrantId
	source, err := me.CapabilityTokenFor(ctx, grantID, agentsdk.WithTokenClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	first, err := source.Token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	life := source.Grant().ExpiresAt.Sub(clk.Now())
	if life <= 0 || life >= time.Hour {
		t.Fatalf("first token lives %s; want a short token under the grant's hour", life)
	}

	clk.Advance(life / 2)
	if again, err := source.Token(ctx); err != nil || again != first {
		t.Fatalf("half-way through its life: token changed=%v err=%v; want the same token", again != first, err)
	}

	// Walk through token lifetimes (the agent's own credential, unrefreshed
	// without a session, bounds how far); every answer must be fresh.
	for i := 0; i < 2; i++ {
		clk.Advance(life * 3 / 4)
		tok, err := source.Token(ctx)
		if err != nil {
			t.Fatalf("refresh %d: %v", i, err)
		}
		if left := source.Grant().ExpiresAt.Sub(clk.Now()); left <= life/3 {
			t.Fatalf("refresh %d: token has %s left; want more than a third of %s", i, left, life)
		}
		if tok == first {
			t.Fatalf("refresh %d: still the first token", i)
		}
	}

	if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grantID}, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	clk.Advance(life * 3 / 4)
	if _, err := source.Token(ctx); connect.CodeOf(err) != connect.CodePermissionDenied && connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("after revocation: err = %v; want a refusal", err)
	}
}
