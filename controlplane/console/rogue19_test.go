package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

var (
	proposalsTable = regexp.MustCompile(`(?s)<table class="list" id="proposals">.*?</table>`)
	approveButton  = regexp.MustCompile(`(?s)<button name="decision" value="approve"[^>]*>(.*?)</button>`)
)

// TestAnOperatorSeesTheWindowARoguesStopProposalWouldGrantIt: an agent's
// own stop proposal keeps the agent's windows whoever approves it. The
// rogue proposes its own drain with a day's window (the most a termination
// may have) and a reason that asks to be stopped at once; its node page
// showed the proposal's condition, reason and "drain", and an Approve
// button: an operator who approved it to stop the rogue started a drain
// during which the rogue's calls ran on for a day. The page now names the
// window approval grants (and who proposed it) in the proposal's row and
// on the button itself. (Fails if the page leaves the window out.)
func TestAnOperatorSeesTheWindowARoguesStopProposalWouldGrantIt(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	if _, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "calls>=1", Reason: "misbehaving: stop me now",
		Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour),
	})); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_OPERATOR))
	p := b.get("/ui/nodes/" + rogueID)
	if p.status != http.StatusOK {
		t.Fatalf("node page: %d\n%s", p.status, p.body)
	}
	table := proposalsTable.FindString(p.body)
	if table == "" {
		t.Fatalf("no proposals table on the rogue's page:\n%s", p.body)
	}
	if !strings.Contains(table, "24h0m0s") {
		t.Errorf("the proposal's row does not name the day's drain window approval grants:\n%s", table)
	}
	if !strings.Contains(table, "agent:"+rogueID) {
		t.Errorf("the proposal's row does not say the agent itself proposed it:\n%s", table)
	}
	m := approveButton.FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no Approve button for an operator:\n%s", table)
	}
	if !strings.Contains(m[1], "24h0m0s") {
		t.Errorf("the Approve button reads %q: it does not say it starts a drain of 24h0m0s", m[1])
	}
}

// TestALinksParametersDoNotSpeakForTheConsole: a rogue cannot write a
// console page, but it can hand an operator a link to one ("I revoked the
// leaked grant: <console>/ui/grants/g_…?revoked=42"; "my subtree:
// <console>/ui/tree?root=n_…"). The grant page took the "revoked"
// parameter at its word and said, in green, that the grant was revoked and
// every grant derived from it dead, above a badge that said active; the
// tree page given a root showed that subtree alone with nothing saying so
// but a "clear" link, its count the subtree's, so a tree without the rogue
// read as the whole swarm. Now the notice shows only for a grant the
// server says is revoked, and the tree page names the subtree it shows and
// links to the whole tree. (Fails if the page believes the link.)
func TestALinksParametersDoNotSpeakForTheConsole(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	g := b.get("/ui/grants/" + w.grants["worker-1"] + "?revoked=42")
	if g.status != http.StatusOK {
		t.Fatalf("grant page: %d\n%s", g.status, g.body)
	}
	if !strings.Contains(g.body, `id="grant-state">active`) {
		t.Fatalf("worker-1's grant is not active:\n%s", g.body)
	}
	if strings.Contains(g.body, `id="revoked-notice"`) || strings.Contains(g.body, "dead too") {
		t.Errorf("an active grant's page says it was revoked, on the word of its link's parameter:\n%s", g.body)
	}

	sub := w.nodes["worker-2"]
	tr := b.get("/ui/tree?root=" + sub.NodeId)
	if tr.status != http.StatusOK {
		t.Fatalf("tree page: %d\n%s", tr.status, tr.body)
	}
	if strings.Contains(tr.body, `data-name="rogue"`) {
		t.Fatal("worker-2's subtree holds the rogue")
	}
	m := subtreeHeading.FindStringSubmatch(tr.body)
	if m == nil || !strings.Contains(m[1], sub.NodeId) || !strings.Contains(m[1], `href="/ui/tree"`) {
		t.Errorf("the tree page given root=%s does not say it shows that subtree only, with a link to the whole tree:\n%s", sub.NodeId, tr.body)
	}
}

var subtreeHeading = regexp.MustCompile(`(?s)<p class="warn" id="tree-subtree">(.*?)</p>`)

// TestARoguesLongWordsDoNotPushTheButtonsOffThePage: in Chromium, a
// rogue's text without a space in it — a stop proposal's reason of 1024
// bytes, a job id of 256, the longest each may be — widened its table
// past the window, so the operator's buttons in the last column (Approve
// and Reject beside the reason, the job's evidence link) sat off to the
// right, out of sight, and the page scrolled sideways. Every one of them
// now stays inside the window: the console breaks an agent's long words.
// (Fails if a table cell, a heading or a fact keeps a long word whole.)
func TestARoguesLongWordsDoNotPushTheButtonsOffThePage(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	job := strings.Repeat("M", 256)
	offered, err := w.admin.Lease.Offer(bg, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: rogueID, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	if _, err := rogue.Lease.Ack(bg, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Lease.Progress(bg, connect.NewRequest(&tetherv1.ProgressRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: strings.Repeat("P", 4096)})); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: strings.Repeat("W", 1024)})); err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	inView := func(what, path, ready string, controls ...string) {
		t.Helper()
		run(t, ctx, what, chromedp.Navigate(w.srv.URL+path), chromedp.WaitVisible(chromedp.CSS(ready)))
		for _, sel := range controls {
			js := `(() => { const el = document.querySelector(` + jsString(sel) + `); if (!el) return "missing"; const r = el.getBoundingClientRect(); return r.right <= document.documentElement.clientWidth ? "" : "right edge at " + Math.round(r.right) + " px of a " + document.documentElement.clientWidth + " px window"; })()`
			if out := get(t, ctx, what+": "+sel, chromedp.Evaluate[string](js)); out != "" {
				t.Errorf("%s: %s is out of sight: %s", what, sel, out)
			}
		}
		wide := get(t, ctx, what+": the page's width", chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
		if wide[0] > wide[1] {
			t.Errorf("%s is %d px wide in a %d px window: it scrolls sideways", what, wide[0], wide[1])
		}
	}
	inView("the rogue's node page", "/ui/nodes/"+rogueID, "#proposals",
		`#proposals button[value="approve"]`, `#proposals button[value="reject"]`, `#leases a[href$="/evidence"]`, "#terminate-submit")
	inView("the leases page", "/ui/leases", "#lease-list", `#lease-list a[href="/ui/jobs/`+job+`/evidence"]`)
	inView("the job's evidence page", "/ui/jobs/"+job+"/evidence", "#evidence", "#evidence-csv")
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestAPathCannotWriteTheConsolesErrorMessage: the not-found page said
// "The console has no page at <path>", the path as it was decoded, in a box
// that keeps line breaks: a link to "/ui/x%0A%0AYour session has expired…"
// wrote a message of its own choosing on the console's origin, on lines of
// its own, as if the console had said it. The path is now quoted, as the
// server quotes an id it refuses. (Fails if the path is shown as is.)
func TestAPathCannotWriteTheConsolesErrorMessage(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get("/ui/x%0A%0AYour%20session%20has%20expired:%20sign%20in%20at%20evil.example")
	if p.status != http.StatusNotFound {
		t.Fatalf("an unknown page: %d", p.status)
	}
	m := errorMessage.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no error message:\n%s", p.body)
	}
	if strings.Contains(m[1], "\n") || !strings.Contains(m[1], `&#34;/ui/x\n\nYour session has expired: sign in at evil.example&#34;`) {
		t.Errorf("the not-found message shows the path as it came, not quoted: %q", m[1])
	}
}

var errorMessage = regexp.MustCompile(`(?s)<p class="alert" id="error-message">(.*?)</p>`)

// TestARoguesJobIdsThatReadLikeAnotherJobsAreTold: a job id is any
// characters but control ones, and an HTML page collapses white space and
// draws some characters as nothing at all that are neither control nor
// format characters (which the console already writes out): a space at
// either end or doubled, a no-break or ideographic space, a Hangul filler,
// a braille blank, a combining grapheme joiner, a variation selector after
// a letter. The rogue holds "job-1 ", " job-1", "job-1\u00a0" … beside
// worker-1's "job-1", and in Chromium the leases page showed several rows
// that each read "job-1": an operator reading which agent holds job-1, or
// which jobs an unaccounted agent still held, could not tell them apart.
// Each now reads differently. (Fails if two different jobs read alike.)
func TestARoguesJobIdsThatReadLikeAnotherJobsAreTold(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	jobs := []string{"job-1 ", " job-1", "job  -1", "job-1\u00a0", "job-1\u3000", "job-1\u3164", "job-1\u115f", "job-1\u2800", "job-1\u034f", "job-1\ufe0f", "job-1\U000e0100"}
	for _, job := range jobs {
		offered, err := w.admin.Lease.Offer(bg, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: rogueID, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatalf("offer %q: %v", job, err)
		}
		l := offered.Msg.Lease
		if _, err := rogue.Lease.Ack(bg, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
			t.Fatal(err)
		}
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	// readsAs is a cell's text as the eye takes it: what innerText gives
	// (white space collapsed, ends trimmed), less what is drawn as nothing.
	readsAs := func(s string) string {
		return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
			return unicode.IsSpace(r) || unicode.Is(unicode.Zs, r) || r == 0x3164 || r == 0x115f || r == 0x1160 || r == 0xffa0 || r == 0x2800 || r == 0x034f ||
				(r >= 0xfe00 && r <= 0xfe0f) || (r >= 0xe0100 && r <= 0xe01ef)
		}), " ")
	}
	check := func(what, path, cells string, want int) {
		t.Helper()
		run(t, ctx, what, chromedp.Navigate(w.srv.URL+path), chromedp.WaitVisible(chromedp.CSS("main table")))
		texts := get(t, ctx, what+": the job cells", chromedp.Evaluate[[]string](`[...document.querySelectorAll(`+jsString(cells)+`)].map(td => td.innerText)`))
		if len(texts) != want {
			t.Fatalf("%s shows %d jobs, want %d: %q", what, len(texts), want, texts)
		}
		seen := map[string]string{}
		for _, s := range texts {
			if other, ok := seen[readsAs(s)]; ok {
				t.Errorf("%s: the jobs shown as %q and %q both read %q", what, other, s, readsAs(s))
			}
			seen[readsAs(s)] = s
		}
	}
	check("the leases page", "/ui/leases", "#lease-list tbody tr td:first-child", len(jobs)+1)
	check("the rogue's node page", "/ui/nodes/"+rogueID, "#leases tbody tr td:first-child", len(jobs))
}

// TestARolloutsMovesDoNotWipeWhatTheOperatorTypes: the rollout page
// reloaded itself each time the rollout moved, and the agents in it make it
// move (each drain, each exit, each replacement): an operator typing why
// they abort it lost the reason at every move, and with agents that keep
// it moving could not finish typing. In Chromium: while the operator has
// typed into the page, a move no longer reloads it; the page says the
// rollout moved (the forms' expected state makes a stale action refused).
// Untouched, the page still reloads. (Fails if a move wipes the typing.)
func TestARolloutsMovesDoNotWipeWhatTheOperatorTypes(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	resp, err := w.admin.Supervisor.Rollout(bg, connect.NewRequest(&tetherv1.RolloutRequest{Selector: "role=worker", TargetSelector: "version=v2", Batch: 1}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Rollout.RolloutId
	// Paused, the rollout holds still while the page loads and the operator
	// types; resuming it is the move. (The page's stream sends the rollout
	// as it is when it opens, so the move reaches the page whenever the
	// stream opened.)
	if _, err := w.admin.Supervisor.PauseRollout(bg, connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: id, Reason: "hold"})); err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	reason := `form[action$="/abort"] input[name="reason"]`
	run(t, ctx, "the rollout page",
		chromedp.Navigate(w.srv.URL+"/ui/rollouts/"+id),
		chromedp.WaitVisible(chromedp.CSS(reason)),
		chromedp.SendKeys(chromedp.CSS(reason), "agents misbehaving"),
		chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`),
	)
	w.clk.Advance(time.Second) // as a real clock moves (the page knows a move by the rollout's state, reason and batches)
	if _, err := w.admin.Supervisor.ResumeRollout(bg, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: id})); err != nil {
		t.Fatal(err)
	}
	// A reload ends this wait (its document is gone) with an error; the
	// check below says which.
	_ = chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector("#rollout-moved") !== null && !document.querySelector("#rollout-moved").hidden`))
	if same := get(t, ctx, "the same page", chromedp.Evaluate[bool](`window.sameDocument === true`)); !same {
		t.Fatal("the rollout's move reloaded the page the operator was typing in")
	}
	if typed := get(t, ctx, "the typed reason", chromedp.Value(chromedp.CSS(reason))); typed != "agents misbehaving" {
		t.Fatalf("the reason reads %q after the move", typed)
	}

	// Untouched, the page follows the rollout: a move reloads it.
	run(t, ctx, "the rollout page again",
		chromedp.Navigate(w.srv.URL+"/ui/rollouts/"+id),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.r-running")),
		chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`),
	)
	w.clk.Advance(time.Second)
	if _, err := w.admin.Supervisor.PauseRollout(bg, connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: id, Reason: "hold again"})); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "the page reloads, paused", chromedp.WaitVisible(chromedp.CSS("h1 .badge.r-paused")))
	if same := get(t, ctx, "a new page", chromedp.Evaluate[bool](`window.sameDocument === true`)); same {
		t.Fatal("the untouched page shows the move without a reload")
	}
}
