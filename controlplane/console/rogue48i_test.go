package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue48IACookieSetForItsPathCannotHideTheRogueFromItsOperator:
// cookies are not isolated by port (RFC 6265 §8.5), and a server of any
// port of the console's host may set a cookie of the console's name for
// any path of the host. Over plain HTTP a rogue agent serving a page
// there ("my report: http://127.0.0.1:…/") set, with that page,
// tether_console=x for the path of its own node page: the browser sends
// the cookie of the longer path first, the console read that one alone,
// found no session and sent the operator to sign in (and the sign-in
// page, not under that path, back to the tree) from the rogue's node page
// and from its stop (POST …/terminate is under the same path), however
// often the operator signed in again, for as long as the rogue chose;
// every other page read as before. In real Chromium: the operator signs in, opens the rogue's
// page, and goes to stop the rogue from its node page.
// The console now reads every cookie of its name the browser sends and
// takes the session among them: the rogue's node page shows, its stop is
// made.
func TestRogue48IACookieSetForItsPathCannotHideTheRogueFromItsOperator(t *testing.T) {
	ctx := chrome(t)
	srv, rogue, operator := rogue45AWorld(t)
	base := srv.URL
	rogueNode := "/ui/nodes/" + rogue.NodeId
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.SetCookie(rw, &http.Cookie{Name: "tether_console", Value: "gone", Path: rogueNode, MaxAge: 86400})
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
	run(t, ctx, "the operator opens the rogue's node page",
		chromedp.Navigate(base+rogueNode),
		chromedp.WaitVisible(chromedp.CSS("#terminate-form, #tree, #token")),
	)
	if at := get(t, ctx, "the page's address", chromedp.Evaluate[string](`location.pathname`)); at != rogueNode {
		// The node page sent the operator to sign in, and the sign-in
		// page (where the rogue's cookie is not sent) back to the tree.
		t.Fatalf("the signed-in operator who opened the rogue's node page is at %s (the rogue's cookie for its path was read alone)", at)
	}
	run(t, ctx, "the operator stops the rogue from its node page",
		chromedp.Click(chromedp.CSS("#mode-abort")),
		chromedp.Click(chromedp.CSS("#terminate-submit")),
		chromedp.WaitVisible(chromedp.CSS("#termination, #error-heading, #token")),
	)
	if body := get(t, ctx, "the page after the stop", chromedp.Evaluate[string](`document.querySelector("#termination") ? "" : (document.querySelector("main") || document.body).innerText`)); body != "" {
		t.Fatalf("the operator's stop of the rogue: %s", body)
	}
	got, err := srv.AdminClients().Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Node.TerminationId == "" {
		t.Fatalf("the rogue has no termination after the operator's stop")
	}
}

// TestRogue48IAStopUnderARoguesCookiePathIsMade: the stop itself, posted
// from the rogue's node page under a cookie the rogue set for that path
// (the jar sends the cookie of the longer path first, as a browser
// does). The console read the rogue's cookie alone: the stop was refused
// 401 "not signed in" and started nothing, and the rogue's node page sent
// the operator to sign in. Now the node page is served and the stop
// made; a cookie the rogue set for the path of another page that names
// no session changes nothing there either.
func TestRogue48IAStopUnderARoguesCookiePathIsMade(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	if p := b.signIn(w.srv.Admin); p.status != http.StatusSeeOther {
		t.Fatalf("sign in: %d", p.status)
	}
	rogueNode := "/ui/nodes/" + w.nodes["rogue"].NodeId
	csrf := b.csrf(rogueNode)
	u, _ := url.Parse(w.srv.URL + rogueNode)
	b.hc.Jar.SetCookies(u, []*http.Cookie{{Name: "tether_console", Value: "gone", Path: rogueNode}})
	tree, _ := url.Parse(w.srv.URL + "/ui/tree")
	b.hc.Jar.SetCookies(tree, []*http.Cookie{{Name: "tether_console", Value: "", Path: "/ui/tree"}})
	p := b.post(rogueNode+"/terminate", url.Values{"csrf": {csrf}, "expected_state": {"running"}, "mode": {"abort"}, "reason": {"rogue"}}, b.sameOrigin())
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/terminations/") {
		t.Fatalf("the operator's stop of the rogue under the rogue's cookie: %d (Location %q); want 303 to its termination\n%.2000s", p.status, p.header.Get("Location"), p.body)
	}
	term := strings.TrimPrefix(p.header.Get("Location"), "/ui/terminations/")
	got, err := w.admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term}))
	if err != nil || got.Msg.Termination.NodeId != w.nodes["rogue"].NodeId {
		t.Fatalf("the termination the stop started: %v %v", got, err)
	}
	if p := b.get(rogueNode); p.status != http.StatusOK {
		t.Fatalf("the rogue's node page under the rogue's cookie for its path: %d (Location %q), want 200", p.status, p.header.Get("Location"))
	}
	if p := b.get("/ui/tree"); p.status != http.StatusOK {
		t.Fatalf("the tree page under the rogue's empty cookie for its path: %d (Location %q), want 200", p.status, p.header.Get("Location"))
	}
}
