package controlplane_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixth rogue pass: the surfaces the first five trod least (the
// console's endpoints, the MCP gateway, grants at their edges, resources
// before authentication). Each test plays one rogue through the real server
// (Badger on disk, real HTTP, real JWTs, the manual clock).

// clientFrom is an HTTP/1.1 client whose connections leave from the
// loopback address local (127.0.0.0/8 is all this machine's), so that one
// test can play callers at two source addresses. It follows no redirect.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// signInAt posts token to the console's sign-in form and returns the status
// and the page.
func signInAt(t *testing.T, hc *http.Client, base, token string) (int, string) {
	t.Helper()
	resp, err := hc.PostForm(base+"/ui/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A rogue cannot lock the operators out of the console. The console checks
// a pasted token with WhoAmI through the API in process, and the API bounds
// per source address the requests that carry no valid credential. Every
// sign-in came from one address, "console", whoever posted it: a rogue
// posting garbage to /ui/signin (from anywhere, without any credential)
// spent that address's budget, and every operator's sign-in with a token
// the server had not verified yet was refused "rate limit for requests
// without a valid credential from console" for as long as the rogue went
// on — at ten posts a second, for ever, exactly when the operator needs the
// console to stop it. A sign-in is now charged to the address that posted
// it: the rogue exhausts its own, the operator signs in.
func TestARogueCannotLockOperatorsOutOfTheConsoleSignIn(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 1 })
	created, err := srv.AdminClients().Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_OPERATOR}))
	if err != nil {
		t.Fatal(err)
	}
	rogue, operator := clientFrom("127.0.0.2"), clientFrom("127.0.0.1")
	var page string
	for i := range 4 { // the burst is 2: the third and fourth are refused
		var status int
		status, page = signInAt(t, rogue, srv.URL, "garbage-token")
		if status != http.StatusUnauthorized {
			t.Fatalf("the rogue's sign-in %d: status %d, want 401:\n%s", i+1, status, page)
		}
	}
	if !strings.Contains(page, "rate limit for requests without a valid credential from 127.0.0.2") {
		t.Fatalf("the rogue's fourth sign-in was not charged to its own address:\n%s", page)
	}
	status, page := signInAt(t, operator, srv.URL, created.Msg.Token)
	if status != http.StatusSeeOther {
		t.Fatalf("the operator's sign-in from another address: status %d, want 303 (signed in):\n%s", status, page)
	}
}
