package controlplane_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// consoleSignIn signs in to the console with token and returns the
// session's cookie ("name=value").
func consoleSignIn(t *testing.T, srv *testserver.Server, token string) string {
	t.Helper()
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	signin, err := browser.PostForm(srv.URL+"/ui/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	signin.Body.Close()
	for _, c := range signin.Cookies() {
		if c.Name == "tether_console" {
			return c.Name + "=" + c.Value
		}
	}
	t.Fatalf("the sign-in answered %s with no session cookie", signin.Status)
	return ""
}

// TestRogue29AConsolePageExemptionEndsWithTheOperatorsCredential: a
// connection once bound to an operator wrote every console page past
// controlplane.PreAuthRequests, for as long as it lived, whoever asked and
// whatever became of the operator's credential. An operator whose token
// was revoked (a stolen one, or an insider's), holding a connection one
// call of that token had bound, asked console pages on it — with the
// console session the token had opened, or with none — and granted no
// flow-control window: each page waited for its write deadline, its
// goroutine and request held, 240 on one connection, over the operator's
// share of the connections. A page is now written past the bound only when
// its own session's call to the API was admitted as an operator's, which
// a revoked or expired token's is not: past the bound the others have
// their stream reset, and the connection is kept.
func TestRogue29AConsolePageExemptionEndsWithTheOperatorsCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	const flood = 240
	for _, tc := range []struct {
		name    string
		session bool // the pages carry the revoked token's console session
	}{
		{"with the revoked token's session", true},
		{"without a session", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A server each: the revoked token's refusals spend its
			// address's anonymous budget.
			srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 100 })
			admin := srv.AdminClients()
			addr := hostOf(t, srv.URL)
			tok := createToken(t, admin, tetherv1.Role_ROLE_ADMIN, "mallory", time.Hour)
			cookie := consoleSignIn(t, srv, tok.Token)
			r := newStallRogue(t, addr)
			bindStalled(t, r, tok.Token)
			if _, err := admin.Auth.RevokeToken(context.Background(), connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: tok.TokenId, Reason: "stolen"})); err != nil {
				t.Fatal(err)
			}
			g0, _ := serverLoad()
			fields := [][2]string{{":method", "GET"}, {":path", "/ui/tree"}}
			if tc.session {
				fields = append(fields, [2]string{"cookie", cookie})
			}
			var ids []uint32
			for range flood {
				id, err := openRaw(r, true, fields...)
				if err != nil {
					t.Fatalf("the connection failed after %d pages: %v", len(ids), err)
				}
				ids = append(ids, id)
			}
			ended := func() int {
				n := 0
				for _, id := range ids {
					if r.isEnded(id) {
						n++
					}
				}
				return n
			}
			testserver.WaitFor(t, closeWait, "all but PreAuthRequests of the unread pages to be ended", func() bool {
				return ended() >= flood-controlplane.PreAuthRequests
			})
			g, _ := serverLoad()
			t.Logf("%d pages: %d ended; goroutines %d -> %d", flood, ended(), g0, g)
			if r.isClosed() {
				t.Fatal("the bound connection was closed; only the unread pages were to end")
			}
		})
	}
}
