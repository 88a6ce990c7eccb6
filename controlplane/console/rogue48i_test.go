package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
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
	operatorOpensRoguesPage(t, ctx, base, operator, func(rw http.ResponseWriter, _ *http.Request) {
		http.SetCookie(rw, &http.Cookie{Name: "tether_console", Value: "gone", Path: rogueNode, MaxAge: 86400})
	})
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

// rogue48IBSpawns is how many children labelled like the agents a
// rollout replaces the rogue spawns while the operator watches the
// rollout's page: each moved the rollout's count, and each move reloaded
// the page (a read of the rollout and a new stream: two of the operator's
// requests), together past the operator's budget of rogue45ABurst.
const rogue48IBSpawns = 28

// TestRogue48IBARogueMovingARolloutsCountsCannotSpendTheOperatorsBudget:
// a rollout's page reloaded itself whenever WatchRollout reported the
// rollout moved, and a rollout moves when the count of agents its
// selector matches does: an agent spawning a child labelled like the
// agents being replaced moves it. In real Chromium, with a budget that
// never refills (the manual clock): the operator watches a rollout's
// page; the rogue spawns 28 children labelled role=worker, one at a
// time, the page showing each count before the next; then the operator
// goes to stop the rogue. Each spawn (one of the rogue's requests) cost
// the operator two (the page's read of the rollout and its new stream),
// and the operator's stop was refused "rate limit … exceeded". The page
// now reloads only when the rollout's state or its batches change and
// writes a move of its counts into the page from the event itself.
func TestRogue48IBARogueMovingARolloutsCountsCannotSpendTheOperatorsBudget(t *testing.T) {
	ctx := chrome(t)
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, rogue45ABurst })
	base := srv.URL
	admin := srv.AdminClients()
	bg := context.Background()
	root, err := admin.Agent.RegisterRoot(bg, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	rogue, rogueClients := root.Msg.Node, srv.Clients(root.Msg.Credential)
	tok, err := admin.Auth.CreateToken(bg, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_OPERATOR, Ttl: durationpb.New(time.Hour), Subject: "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Agent.RegisterRoot(bg, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "svc", Labels: map[string]string{"role": "worker"}})); err != nil {
		t.Fatal(err)
	}
	ro, err := admin.Supervisor.Rollout(bg, connect.NewRequest(&tetherv1.RolloutRequest{Selector: "role=worker", TargetSelector: "version=v2", Batch: 1, Description: "model v2"}))
	if err != nil {
		t.Fatal(err)
	}
	id := ro.Msg.Rollout.RolloutId
	signInBrowser(t, ctx, base, tok.Msg.Token)
	run(t, ctx, "the operator opens the rollout's page, its first batch started",
		chromedp.Navigate(base+"/ui/rollouts/"+id),
		chromedp.WaitVisible(chromedp.CSS(`#batches tbody tr[class^="b-"]`)),
	)
	first, err := strconv.Atoi(get(t, ctx, "the page's count", chromedp.Evaluate[string](`document.querySelector("#rollout progress").getAttribute("max")`)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range rogue48IBSpawns {
		// A millisecond between moves, as on a real clock: the rollout's
		// UpdatedAt is the clock's (the operator's budget refills by a
		// thousandth of a request).
		clk.Advance(time.Millisecond)
		if _, err := rogueClients.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.NodeId, Name: "w" + strconv.Itoa(i), Labels: map[string]string{"role": "worker"}})); err != nil {
			t.Fatalf("spawn %d: %v", i, err)
		}
		// The rollout counts the spawn (its reconcile, kicked by it), and
		// the page shows the count before the next spawn.
		want := strconv.Itoa(first + i + 1)
		run(t, ctx, "the page shows the rollout's count "+want,
			chromedp.WaitVisible(chromedp.CSS(`#rollout progress[max="`+want+`"]`)),
		)
	}
	run(t, ctx, "the operator stops the rogue from its node page",
		chromedp.Navigate(base+"/ui/nodes/"+rogue.NodeId),
		chromedp.WaitVisible(chromedp.CSS("#terminate-form, #error-heading")),
	)
	if heading := get(t, ctx, "the node page", chromedp.Evaluate[string](`(document.querySelector("#error-heading") || {}).textContent || ""`)); heading != "" {
		t.Fatalf("the rogue's node page after its %d spawns: %s", rogue48IBSpawns, get(t, ctx, "the error", chromedp.Evaluate[string](`document.querySelector("main").innerText`)))
	}
	run(t, ctx, "the stop",
		chromedp.Click(chromedp.CSS("#mode-abort")),
		chromedp.Click(chromedp.CSS("#terminate-submit")),
		chromedp.WaitVisible(chromedp.CSS("#termination, #error-heading")),
	)
	if heading := get(t, ctx, "the page after the stop", chromedp.Evaluate[string](`(document.querySelector("#error-heading") || {}).textContent || ""`)); heading != "" {
		t.Fatalf("the operator's stop of the rogue after its %d spawns: %s", rogue48IBSpawns, get(t, ctx, "the error", chromedp.Evaluate[string](`document.querySelector("main").innerText`)))
	}
}
