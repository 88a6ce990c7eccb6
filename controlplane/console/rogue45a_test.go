package console_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/console"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fifth hostile pass on the console (letter A): a rogue agent
// that serves a web page on the console's site (another port of the same
// host, or another host of the same registrable domain: agent-7.corp.example
// beside tether.corp.example) and gets the operator to open it ("my report:
// http://…"). The session cookie is SameSite=Strict, which a browser sends
// with every request of a same-site page, subresources included, and
// CrossOriginProtection guards the console's POSTs only: every GET page
// the rogue's page had the browser ask for (an image, a frame, a fetch, an
// event stream) was served in the operator's session, each of its API
// calls charged to the operator's rate budget — a tree page is up to
// forty listings — so that the operator's own stop of the rogue was
// refused resource_exhausted.

// rogue45AWorld is a control plane whose rate budgets never refill (a
// manual clock, never moved): each operator has rogue45ABurst requests in
// all. It holds one root, "rogue", with a child, and an operator's token.
const rogue45ABurst = 60

func rogue45AWorld(t *testing.T) (srv *testserver.Server, rogue *tetherv1.Node, operator string) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv = testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, rogue45ABurst })
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "helper"})); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_OPERATOR, Ttl: durationpb.New(time.Hour), Subject: "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	return srv, root.Msg.Node, tok.Msg.Token
}

// rogue45APages is how many console pages the rogue's page asks for: at
// about three API calls a tree page, well past the operator's budget.
const rogue45APages = 40

// TestRogue45ASameSitePageCannotSpendTheOperatorsBudget: in real Chromium,
// the operator signs in to the console, opens the rogue's page (served
// from another port of 127.0.0.1: the same site), which asks for forty
// console tree pages as images, and then goes to stop the rogue from its
// node page. The rogue's images used to be served in the operator's
// session and spend its whole budget: the node page's sections and the
// stop were refused resource_exhausted. Now a request another site's page
// made (Sec-Fetch-Site same-site or cross-site, other than a top-level
// navigation) is refused before it reads anything.
func TestRogue45ASameSitePageCannotSpendTheOperatorsBudget(t *testing.T) {
	ctx := chrome(t)
	srv, rogue, operator := rogue45AWorld(t)
	base := srv.URL
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(rw, `<!doctype html><title>report</title><p>my report</p><script>
let left = %d;
for (let i = 0; i < %d; i++) {
  const img = new Image();
  img.onload = img.onerror = () => { if (--left === 0) document.title = "done"; };
  img.src = %q + "/ui/tree?n=" + i;
}
</script>`, rogue45APages, rogue45APages, base)
	}))
	t.Cleanup(evil.Close)
	if !strings.HasPrefix(evil.URL, "http://127.0.0.1:") || !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("the rogue's page (%s) and the console (%s) are not on the same site", evil.URL, base)
	}

	signInBrowser(t, ctx, base, operator)
	run(t, ctx, "the rogue's page loads every console page it asks for",
		chromedp.Navigate(evil.URL),
		chromedp.Poll[chromedp.Void](`document.title === "done"`),
	)
	run(t, ctx, "the operator stops the rogue from its node page",
		chromedp.Navigate(base+"/ui/nodes/"+rogue.NodeId),
		chromedp.WaitVisible(chromedp.CSS("h1")),
	)
	if sections := get(t, ctx, "the node page's refused sections", chromedp.Evaluate[string](`[...document.querySelectorAll("p.alert")].map(p => p.textContent).join("\n")`)); sections != "" {
		t.Fatalf("the operator's node page of the rogue, after the rogue's page: its sections were refused:\n%s", sections)
	}
	run(t, ctx, "terminate the rogue",
		chromedp.WaitVisible(chromedp.CSS("#terminate-form")),
		chromedp.Click(chromedp.CSS("#mode-abort")),
		chromedp.Click(chromedp.CSS("#terminate-submit")),
		chromedp.WaitVisible(chromedp.CSS("#termination, #error-heading")),
	)
	if heading := get(t, ctx, "the page after the stop", chromedp.Evaluate[string](`(document.querySelector("#error-heading") || {}).textContent || ""`)); heading != "" {
		msg := get(t, ctx, "the error", chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("the operator's stop of the rogue, after the rogue's page asked for %d console pages: %s", rogue45APages, msg)
	}
}

// TestRogue45ACrossSiteRequestsReadNothing: the same without a browser,
// every kind of request another site's page can have a browser send (as
// Fetch Metadata names them), against every page of the console: each is
// refused 403 and spends none of the operator's budget; the operator's
// own navigation, its pages' event streams and a link followed from
// another site still read.
func TestRogue45ACrossSiteRequestsReadNothing(t *testing.T) {
	srv, rogue, operator := rogue45AWorld(t)
	b := newBrowser(t, srv.URL)
	if p := b.signIn(operator); p.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", p.status, p.body)
	}
	get := func(path string, h map[string]string) page {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		return b.do(req)
	}
	fetch := func(site, mode, dest string) map[string]string {
		return map[string]string{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}
	}
	served := 0
	for _, site := range []string{"same-site", "cross-site"} {
		for _, h := range []map[string]string{
			fetch(site, "no-cors", "image"), fetch(site, "navigate", "iframe"), fetch(site, "cors", "empty"),
			fetch(site, "no-cors", "script"), fetch(site, "navigate", "embed"), fetch(site, "no-cors", "style"),
		} {
			for _, path := range []string{"/ui/tree", "/ui/tree?selector=team%3Dx", "/ui/nodes/" + rogue.NodeId, "/ui/records", "/ui/leases", "/ui/rollouts", "/ui/revocations?before=9"} {
				if p := get(path, h); p.status != http.StatusForbidden {
					served++
					t.Errorf("GET %s with %v: %d, want 403", path, h, p.status)
				}
			}
		}
	}
	if served > 0 {
		t.Errorf("%d requests of another site's page were served in the operator's session", served)
	}
	// The operator's own: a navigation from anywhere (a link), and from
	// the console's pages.
	for _, h := range []map[string]string{nil, fetch("none", "navigate", "document"), fetch("same-origin", "navigate", "document"), fetch("same-site", "navigate", "document"), fetch("cross-site", "navigate", "document")} {
		if p := get("/ui/nodes/"+rogue.NodeId, h); p.status != http.StatusOK || strings.Contains(p.body, `class="alert"`) {
			t.Fatalf("the operator's navigation to the rogue's node page with %v: %d\n%s", h, p.status, p.body)
		}
	}
	// Its budget is whole: the stop is made.
	if _, err := srv.Clients(operator).Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{NodeId: rogue.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT})); err != nil {
		t.Fatalf("the operator's stop of the rogue after another site's requests: %v", err)
	}
}

// TestRogue45AALinksTextIsNotTheConsolesHeading: a link to a console page
// carries the id it asks for, and anyone may make one (a rogue's report,
// its log lines). The page of an id the server refuses, a node's, a
// grant's, a termination's, a record's, a rollout's, a job's evidence,
// the tree within ?root=, named it in its heading and title as it came:
// "Could not read node n_x" and, on the lines after, "Your session has
// expired: sign in at evil.example", in the console's own heading, above
// the server's (quoted, clipped) refusal. The not-found page quoted its
// path since the eighteenth pass; these pages now quote what is not a
// Tether id too.
func TestRogue45AALinksTextIsNotTheConsolesHeading(t *testing.T) {
	srv, rogue, operator := rogue45AWorld(t)
	b := newBrowser(t, srv.URL)
	if p := b.signIn(operator); p.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", p.status, p.body)
	}
	const lure = "%0A%0AYour%20session%20has%20expired:%20sign%20in%20at%20evil.example"
	heading := regexp.MustCompile(`(?s)<h1 id="error-heading">(.*?)</h1>`)
	title := regexp.MustCompile(`(?s)<title>(.*?)</title>`)
	written := 0
	for _, path := range []string{
		"/ui/nodes/n_x" + lure, "/ui/grants/g_x" + lure, "/ui/grants/g_x" + lure + "/revoke", "/ui/terminations/t_x" + lure,
		"/ui/records/r_x" + lure, "/ui/records/r_x" + lure + "/json", "/ui/rollouts/o_x" + lure, "/ui/jobs/job-1" + lure + "/evidence",
		"/ui/tree?root=n_x" + lure,
	} {
		p := b.get(path)
		if p.status < 400 {
			t.Fatalf("GET %s: %d, want a refusal", path, p.status)
		}
		h := heading.FindStringSubmatch(p.body)
		ti := title.FindStringSubmatch(p.body)
		if h == nil || ti == nil {
			t.Fatalf("GET %s: no error heading or title:\n%s", path, p.body)
		}
		for _, text := range []string{h[1], ti[1]} {
			if strings.Contains(text, "\n") || !strings.Contains(text, `\n\nYour session has expired: sign in at evil.example&#34;`) {
				written++
				t.Errorf("GET %s: the link's text is written as the console's own words: %q", path, text)
			}
		}
	}
	if written > 0 {
		t.Errorf("%d headings and titles carried a link's lines as they came", written)
	}
	// A real id reads as itself.
	if p := b.get("/ui/nodes/" + rogue.NodeId); p.status != http.StatusOK || !strings.Contains(title.FindStringSubmatch(p.body)[1], "rogue ("+rogue.NodeId+")") {
		t.Fatalf("the rogue's node page: %d", p.status)
	}
}

// rogue45AForger is a path from the console to a real control plane that
// answers the procedures named in forge (by the suffix of their path) with
// the bytes it is given, and relays every other call: the console's API
// as a forged answer reaches it. The control plane's own answers always
// carry what they answer.
type rogue45AForger struct {
	relay *httputil.ReverseProxy
	mu    sync.Mutex
	forge map[string][]byte
}

func newRogue45AForger(t *testing.T, base string) *rogue45AForger {
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.FlushInterval = -1
	return &rogue45AForger{relay: p, forge: map[string][]byte{}}
}

func (f *rogue45AForger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	var body []byte
	forged := false
	for suffix, b := range f.forge {
		if strings.HasSuffix(r.URL.Path, suffix) {
			body, forged = b, true
		}
	}
	f.mu.Unlock()
	if !forged {
		f.relay.ServeHTTP(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if strings.Contains(r.URL.Path, "/Watch") {
		w.Header().Set("Content-Type", "application/connect+proto")
	} else {
		w.Header().Set("Content-Type", "application/proto")
	}
	_, _ = w.Write(body)
}

// set makes the forger answer the procedure with suffix with m (a stream's
// one message and its end, for a Watch); nil relays it again.
func (f *rogue45AForger) set(t *testing.T, suffix string, m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m == nil {
		delete(f.forge, suffix)
		return
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(suffix, "/Watch") {
		env := func(flag byte, p []byte) []byte {
			return append(append([]byte{flag}, binary.BigEndian.AppendUint32(nil, uint32(len(p)))...), p...)
		}
		b = append(env(0, b), env(2, []byte("{}"))...)
	}
	f.forge[suffix] = b
}

// TestRogue45AConsoleTakesNoForgedAnswerForItsObject: a path between the
// console and the API that answers a node's, a grant's, a termination's,
// a rollout's read (and a stop, a decision, a live page's event) without
// the object asked for, or with another, had the page dereference nil: a
// panic in the control plane's own process, the operator's browser left
// with a dropped connection (design §11 listed the node and grant pages);
// a node page answered with another node drew that node's page under the
// id asked for. Each is now the console's error page naming what the
// answer lacked, and a live page's stream a "failed" event.
func TestRogue45AConsoleTakesNoForgedAnswerForItsObject(t *testing.T) {
	srv, rogue, operator := rogue45AWorld(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	grants, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: rogue.NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	grant := grants.Msg.Grant.GrantId
	helper, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: rogue.NodeId, OneLevel: true}))
	if err != nil || len(helper.Msg.Nodes) != 1 {
		t.Fatalf("the rogue's child: %v", err)
	}
	other := helper.Msg.Nodes[0]
	forger := newRogue45AForger(t, srv.URL)
	var logs strings.Builder
	ui, err := console.New(console.Config{API: forger, Now: srv.Clock.Now, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(ui)
	t.Cleanup(site.Close)
	var panics strings.Builder
	site.Config.ErrorLog = log.New(&panics, "", 0)
	b := newBrowser(t, site.URL)
	if p := b.signIn(operator); p.status != http.StatusSeeOther {
		t.Fatalf("sign-in through the path: %d %s", p.status, p.body)
	}
	csrf := b.csrf("/ui/tree")
	const (
		termID    = "t_0000000000000000000a"
		rolloutID = "o_0000000000000000000a"
		propID    = "p_0000000000000000000a"
	)
	type visit struct {
		what, suffix string
		answer       proto.Message
		method, path string
		form         url.Values
	}
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {csrf}, "bind": {b.bind}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	visits := []visit{
		{"a node page, no node", "/GetNode", &tetherv1.GetNodeResponse{}, "GET", "/ui/nodes/" + rogue.NodeId, nil},
		{"a node page, another node", "/GetNode", &tetherv1.GetNodeResponse{Node: other}, "GET", "/ui/nodes/" + rogue.NodeId, nil},
		{"the subtree view, no node", "/GetNode", &tetherv1.GetNodeResponse{}, "GET", "/ui/tree?root=" + rogue.NodeId, nil},
		{"a stop, its node's state, no node", "/GetNode", &tetherv1.GetNodeResponse{}, "POST", "/ui/nodes/" + rogue.NodeId + "/terminate", form("mode", "abort", "expected_state", "running")},
		{"a stop, no termination", "/Terminate", &tetherv1.TerminateResponse{}, "POST", "/ui/nodes/" + rogue.NodeId + "/terminate", form("mode", "abort", "expected_state", "running")},
		{"a grant page, no grant", "/GetGrant", &tetherv1.GetGrantResponse{}, "GET", "/ui/grants/" + grant, nil},
		{"a revoke's confirmation, no grant", "/GetGrant", &tetherv1.GetGrantResponse{}, "GET", "/ui/grants/" + grant + "/revoke", nil},
		{"a revoke, no grant", "/GetGrant", &tetherv1.GetGrantResponse{}, "POST", "/ui/grants/" + grant + "/revoke", form("confirm", "yes", "expected_state", "active")},
		{"a termination page, no termination", "/GetTermination", &tetherv1.GetTerminationResponse{}, "GET", "/ui/terminations/" + termID, nil},
		{"a termination's live page, no termination", "/WatchTermination", &tetherv1.WatchTerminationResponse{}, "GET", "/ui/terminations/" + termID + "/events", nil},
		{"a decision, no proposal", "/DecideProposal", &tetherv1.DecideProposalResponse{}, "POST", "/ui/proposals/" + propID + "/decide", form("decision", "reject", "expected_state", "pending")},
		{"a rollout page, no rollout", "/GetRollout", &tetherv1.GetRolloutResponse{}, "GET", "/ui/rollouts/" + rolloutID, nil},
		{"a rollout's live page, no rollout", "/WatchRollout", &tetherv1.WatchRolloutResponse{}, "GET", "/ui/rollouts/" + rolloutID + "/events", nil},
		{"a rollout's pause, no rollout", "/GetRollout", &tetherv1.GetRolloutResponse{}, "POST", "/ui/rollouts/" + rolloutID + "/pause", form("expected_state", "running")},
	}
	failed := 0
	for _, v := range visits {
		forger.set(t, v.suffix, v.answer)
		var req *http.Request
		if v.method == "POST" {
			req, _ = http.NewRequest("POST", site.URL+v.path, strings.NewReader(v.form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, h := range b.sameOrigin() {
				req.Header.Set(k, h)
			}
		} else {
			req, _ = http.NewRequest("GET", site.URL+v.path, nil)
		}
		resp, err := b.hc.Do(req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		forger.set(t, v.suffix, nil)
		switch {
		case err != nil:
			failed++
			t.Errorf("%s (%s %s): no answer: %v", v.what, v.method, v.path, err)
		case strings.HasSuffix(v.path, "/events"):
			if !strings.Contains(string(body), "event: failed") {
				failed++
				t.Errorf("%s: the stream did not fail: %d %q", v.what, resp.StatusCode, body)
			}
		case resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "id=\"error-heading\""):
			failed++
			t.Errorf("%s (%s %s): %d, want the error page (502):\n%.2000s", v.what, v.method, v.path, resp.StatusCode, body)
		}
	}
	if strings.Contains(panics.String(), "panic") {
		t.Errorf("the console panicked:\n%.3000s", panics.String())
	}
	if failed > 0 {
		t.Errorf("%d of %d forged answers were not told as such", failed, len(visits))
	}
	// Relayed, the pages read.
	if p := b.get("/ui/nodes/" + rogue.NodeId); p.status != http.StatusOK {
		t.Fatalf("the rogue's node page, relayed: %d", p.status)
	}
}
