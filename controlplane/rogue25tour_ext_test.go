package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A newcomer who passes a token where its id goes (`tether token revoke
// "$TOKEN"`, the not-found answer even says "pass the token itself") was
// told "capability: invalid grant: token_id of 357 bytes exceeds 128": no
// grant was involved, and nothing said what to pass instead. The answer
// now says it is a token, not its id, and names both ways to revoke it;
// it echoes nothing of the token and changes nothing.
func TestRogue25TourRevokingATokenPassedAsItsIDSaysWhatToPass(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	tok := createToken(t, admin, tetherv1.Role_ROLE_VIEWER, "newcomer", time.Hour)

	_, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: tok.Token, Reason: "oops"}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		t.Fatalf("revoking by a token passed as its id: %v, want invalid_argument", err)
	}
	msg := ce.Message()
	for _, want := range []string{"not its id", "tether token list", "--token-value-file"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the answer %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "grant") {
		t.Errorf("the answer %q speaks of a grant; none was involved", msg)
	}
	if strings.Contains(msg, tok.Token[len(tok.Token)-20:]) || strings.Contains(msg, strings.SplitN(tok.Token, ".", 3)[1][:20]) {
		t.Errorf("the answer %q echoes the token", msg)
	}
	if _, err := srv.Clients(tok.Token).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatalf("the token after the refused revocation: %v, want it still valid", err)
	}

	_, err = admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: "nosuchtoken"}))
	if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound || !strings.Contains(ce.Message(), "--token-value-file") {
		t.Fatalf("revoking an unknown id: %v, want not_found naming --token-value-file", err)
	}
}
