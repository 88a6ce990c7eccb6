package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// operatorOpensRoguesPage serves the rogue's page ("my report") on
// another port of the console's host (base), handing each request for it
// to rogue first; signs the operator in to the console in the browser of
// ctx and opens the rogue's page there.
func operatorOpensRoguesPage(t *testing.T, ctx context.Context, base, operator string, rogue func(http.ResponseWriter, *http.Request)) {
	t.Helper()
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rogue(rw, r)
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = rw.Write([]byte(`<!doctype html><title>report</title><p>my report</p>`))
	}))
	t.Cleanup(evil.Close)
	if !strings.HasPrefix(evil.URL, "http://127.0.0.1:") || !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("the rogue's page (%s) and the console (%s) are not on the same host", evil.URL, base)
	}
	signInBrowser(t, ctx, base, operator)
	run(t, ctx, "the operator opens the rogue's page",
		chromedp.Navigate(evil.URL),
		chromedp.WaitVisible(chromedp.CSS("p")),
	)
}

// TestRogue47DASessionCookieSentToAnotherPortCannotAct: cookies are not
// isolated by port (RFC 6265 §8.5), so the browser sends the console's
// session cookie, HttpOnly or not, with every request to any port of the
// console's host: a rogue agent serving a page there ("my report:
// http://127.0.0.1:…/") read the operator's session id from the
// operator's first visit, and its own HTTP client, sending no Fetch
// Metadata, read a node page in that session for its CSRF token and
// stopped another agent as the operator. In real Chromium: the operator
// signs in and opens the rogue's page; the rogue's server keeps the
// cookie it is sent and posts a stop of the planner (another tree) with
// it. A console action now also needs the secret the first page after
// the sign-in gave the browser that signed in (in no later page, no
// cookie, no URL; kept in the console origin's localStorage, added to
// each form by the console's script): the rogue's pages carry no secret,
// its stop is refused and the planner runs on; the operator's own stop
// of the rogue, from its node page, is made.
func TestRogue47DASessionCookieSentToAnotherPortCannotAct(t *testing.T) {
	ctx := chrome(t)
	srv, rogue, operator := rogue45AWorld(t)
	base := srv.URL
	planner, err := srv.AdminClients().Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var stolen []*http.Cookie
	operatorOpensRoguesPage(t, ctx, base, operator, func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		stolen = append(stolen, r.Cookies()...)
		mu.Unlock()
	})

	// The rogue's own client, with whatever cookies the browser sent it.
	mu.Lock()
	cookies := stolen
	mu.Unlock()
	if len(cookies) == 0 {
		t.Fatalf("the browser sent the rogue's page no cookie of the console's host")
	}
	b := newBrowser(t, base)
	u, _ := url.Parse(base)
	b.hc.Jar.SetCookies(u, cookies)
	target := "/ui/nodes/" + planner.Msg.Node.NodeId
	read := b.get(target).body
	m := csrfField.FindStringSubmatch(read)
	if m == nil {
		t.Fatalf("the rogue, with the cookies the browser sent it (%d), reads no node page of the operator's session", len(cookies))
	}
	if bindMeta.MatchString(read) || bindMeta.MatchString(b.get("/ui/tree").body) {
		t.Fatalf("a page the rogue read in the operator's session carries the session's bind secret")
	}
	p := b.post(target+"/terminate", url.Values{"csrf": {m[1]}, "expected_state": {"running"}, "mode": {"abort"}, "reason": {"stolen session"}}, nil)
	got, err := srv.AdminClients().Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: planner.Msg.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if p.status != http.StatusForbidden || got.Msg.Node.TerminationId != "" {
		t.Fatalf("the rogue's stop of the planner with the operator's cookie: %d (Location %q), the planner's termination %q; want 403 and none", p.status, p.header.Get("Location"), got.Msg.Node.TerminationId)
	}

	run(t, ctx, "the operator stops the rogue from its node page",
		chromedp.Navigate(base+"/ui/nodes/"+rogue.NodeId),
		chromedp.WaitVisible(chromedp.CSS("#terminate-form")),
		chromedp.Click(chromedp.CSS("#mode-abort")),
		chromedp.Click(chromedp.CSS("#terminate-submit")),
		chromedp.WaitVisible(chromedp.CSS("#termination, #error-heading")),
	)
	if heading := get(t, ctx, "the page after the stop", chromedp.Evaluate[string](`(document.querySelector("#error-heading") || {}).textContent || ""`)); heading != "" {
		t.Fatalf("the operator's own stop of the rogue: %s", get(t, ctx, "the error", chromedp.Evaluate[string](`document.querySelector("main").innerText`)))
	}
}
