package agentsdk_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A token a header cannot carry (a file's newline, a CRLF with a header of
// its own, a space) is never sent, and the error never quotes it: the same
// probe as the TypeScript and Python SDKs' tests.
func TestATokenAHeaderCannotCarryIsNotQuoted(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	tok := srv.AdminToken
	for _, bad := range []string{tok + "\n", tok + "\r\nX-Evil: 1", tok[:20] + " " + tok[20:]} {
		conn := agentsdk.Dial(srv.URL, bad)
		_, err := conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if err == nil {
			t.Fatalf("a token with %q was accepted", bad[len(bad)-2:])
		}
		if strings.Contains(err.Error(), tok[:40]) {
			t.Fatalf("the error quotes the token: %.80s", err)
		}
	}
	if _, err := agentsdk.Dial(srv.URL, tok).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatal(err)
	}
}
