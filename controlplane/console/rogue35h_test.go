package console_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue35HALiveStreamEndsWithItsSession: the console's live pages
// (the revocation feed, a termination, a rollout) hold a server-sent event
// stream open, authenticated once when it opened. A session that ended —
// signed out, evicted by its operator's 33rd sign-in, or past its eight
// hours on the control plane's clock — went on receiving the feed on every
// tab it had left open (each revocation's grant and reason), until the
// connection dropped: the session was gone from the table but its streams
// were not. Now a session's end ends its streams, and a stream checks its
// session before each event it relays: nothing reaches a tab after its
// session ended, and the tab is told why.
func TestRogue35HALiveStreamEndsWithItsSession(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// Tokens that outlive the eight-hour session, so that the API itself
	// never refuses them here: only the console's session ends.
	long := func(role tetherv1.Role, subject string) string {
		resp, err := w.admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Ttl: durationpb.New(72 * time.Hour), Subject: subject}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Token
	}
	admin := w.srv.Clients(long(tetherv1.Role_ROLE_ADMIN, "admin-35h"))
	revoke := func(reason string) {
		t.Helper()
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
			HolderNodeId: w.nodes["planner"].NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(time.Hour),
		}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: issued.Msg.Grant.GrantId}, Reason: reason})); err != nil {
			t.Fatal(err)
		}
	}
	// open signs in and opens the feed's stream, read up to its first head.
	open := func(b *browser, token string) *bufio.Scanner {
		t.Helper()
		if p := b.signIn(token); p.status != http.StatusSeeOther {
			t.Fatalf("sign-in: %d", p.status)
		}
		resp, err := b.hc.Get(w.srv.URL + "/ui/revocations/events")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("feed stream: %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "event: head" {
				return sc
			}
		}
		t.Fatalf("the feed's stream ended before its head: %v", sc.Err())
		return nil
	}
	// ended reads the stream to its end: it must carry no tombstone, and
	// say that the session ended.
	ended := func(how string, sc *bufio.Scanner, secret string) {
		t.Helper()
		told := false
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, secret) {
				t.Fatalf("%s, the open feed tab still received a revocation: %s", how, line)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, "session has ended") {
				told = true
			}
		}
		if !told {
			t.Fatalf("%s, the feed's stream ended without saying the session had ended", how)
		}
	}

	viewer := long(tetherv1.Role_ROLE_VIEWER, "viewer-35h")

	// Signed out.
	b := newBrowser(t, w.srv.URL)
	sc := open(b, viewer)
	if p := b.post("/ui/signout", url.Values{"csrf": {b.csrf("/ui/tree")}}, b.sameOrigin()); p.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", p.status)
	}
	revoke("after-sign-out")
	ended("signed out", sc, "after-sign-out")

	// Evicted: its operator signed in 32 more times.
	first := newBrowser(t, w.srv.URL)
	sc = open(first, viewer)
	for range 32 {
		newBrowser(t, w.srv.URL).signIn(viewer)
	}
	revoke("after-eviction")
	ended("evicted", sc, "after-eviction")

	// Expired, on the control plane's clock (the token lives on).
	b = newBrowser(t, w.srv.URL)
	sc = open(b, viewer)
	w.clk.Advance(8*time.Hour + time.Minute)
	revoke("after-expiry")
	ended("expired", sc, "after-expiry")
	if p := b.get("/ui/revocations/events"); p.status != http.StatusUnauthorized {
		t.Fatalf("a new stream of the expired session: %d", p.status)
	}
}
