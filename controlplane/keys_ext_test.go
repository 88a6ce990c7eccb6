package controlplane_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func jwksKids(t *testing.T, srv *testserver.Server) []string {
	t.Helper()
	resp, err := http.Get(srv.URL + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var set struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range set.Keys {
		kids = append(kids, k.Kid)
	}
	return kids
}

// kidOf reads the kid header of a JWT.
func kidOf(t *testing.T, token string) string {
	t.Helper()
	header, _, _ := strings.Cut(token, ".")
	b, err := base64.RawURLEncoding.DecodeString(header)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}

// TestKeyRotation: a rotated-in key is in JWKS at once and signs after its
// publish-ahead; tokens signed by the old key keep working; the old key
// leaves JWKS only once its last token could have expired, and the ring
// survives a restart.
func TestKeyRotation(t *testing.T) {
	clk := clock.NewManual(epoch)
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	before := jwksKids(t, srv)
	if len(before) != 1 {
		t.Fatalf("jwks %v, want one key", before)
	}
	oldKid := before[0]
	agent := register(t, admin, "before-rotation")
	if kidOf(t, agent.Credential) != oldKid {
		t.Fatal("the credential is not signed by the only key")
	}

	// Only admins rotate.
	operator, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_OPERATOR}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(operator.Msg.Token).Auth.RotateKeys(ctx, connect.NewRequest(&tetherv1.RotateKeysRequest{})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("an operator rotated the keys: %v", err)
	}
	if _, err := admin.Auth.RotateKeys(ctx, connect.NewRequest(&tetherv1.RotateKeysRequest{PublishAhead: durationpb.New(-time.Second)})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("negative publish_ahead: %v", err)
	}

	rotated, err := admin.Auth.RotateKeys(ctx, connect.NewRequest(&tetherv1.RotateKeysRequest{PublishAhead: durationpb.New(5 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	newKid := rotated.Msg.Key.Kid
	if kids := jwksKids(t, srv); len(kids) != 2 || !strings.Contains(strings.Join(kids, ","), newKid) {
		t.Fatalf("jwks after rotation %v, want the old and the new key", kids)
	}
	if rotated.Msg.Key.Signing {
		t.Fatal("the new key signs before its publish-ahead elapsed")
	}
	// Published ahead: the old key still signs.
	if kid := kidOf(t, register(t, admin, "during-publish-ahead").Credential); kid != oldKid {
		t.Fatalf("signed by %s during the publish-ahead, want the old key", kid)
	}
	clk.Advance(5 * time.Minute)
	after := register(t, admin, "after-rotation")
	if kid := kidOf(t, after.Credential); kid != newKid {
		t.Fatalf("signed by %s after activation, want the new key %s", kid, newKid)
	}
	// The old key's tokens still verify: the pre-rotation credential works.
	if _, err := srv.Clients(agent.Credential).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatalf("a token signed before the rotation was refused: %v", err)
	}
	var retire time.Time
	for _, k := range rotated.Msg.Keys {
		if k.Kid == oldKid {
			retire = k.RetireAfter.AsTime()
		}
	}
	// Every token type is covered: an operator token may live a year.
	if want := rotated.Msg.Key.ActiveFrom.AsTime().Add(366 * 24 * time.Hour); retire.Before(want) {
		t.Fatalf("old key retires at %s, before the last operator token it signed may expire (%s)", retire, want)
	}

	// The ring is in the store: a restart serves the same keys.
	srv.Stop()
	srv = testserver.StartIn(t, dir, testserver.WithClock(clk))
	if kids := jwksKids(t, srv); len(kids) != 2 {
		t.Fatalf("jwks after restart %v", kids)
	}

	// Just before retirement the old key stays; after it, the pruner drops
	// it (the manual clock fires its wake-up).
	clk.Set(retire)
	if kids := jwksKids(t, srv); len(kids) != 2 {
		t.Fatalf("jwks at the retirement instant %v, want both keys still", kids)
	}
	clk.Set(retire.Add(time.Second))
	testserver.WaitFor(t, 10*time.Second, "the retired key to be pruned", func() bool {
		// A pruner restarted a moment ago may arm its wake-up after the
		// move above, counted from the moved clock: each look moves the
		// clock on a little, so its wake-up comes due whenever it armed.
		clk.Advance(time.Second)
		kids := jwksKids(t, srv)
		return len(kids) == 1 && kids[0] == newKid
	})
	list, err := srv.Clients(srv.Admin).Auth.ListKeys(ctx, connect.NewRequest(&tetherv1.ListKeysRequest{}))
	if err != nil {
		// The bootstrap admin token was signed by the pruned key and has
		// expired with it; mint a fresh one.
		token, _, _, merr := srv.Issuer().MintOperator("admin2", auth.RoleAdmin, clk.Now(), time.Hour)
		if merr != nil {
			t.Fatal(merr)
		}
		list, err = srv.Clients(token).Auth.ListKeys(ctx, connect.NewRequest(&tetherv1.ListKeysRequest{}))
	}
	if err != nil || len(list.Msg.Keys) != 1 || !list.Msg.Keys[0].Signing {
		t.Fatalf("keys after pruning: %v %v", list, err)
	}
}
