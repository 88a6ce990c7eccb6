package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesTextIsInertAndVisibleInTheBrowser: the rogue writes the
// strings an operator's browser shows — job ids it holds, a stop
// proposal's reason and condition, a job's terminal detail — and fills them
// with markup that would run script in the operator's session (a <script>,
// an <img onerror>, an attribute-breaking quote) and with invisible
// characters: "job-1\u200b" beside worker-1's "job-1" (two jobs that read
// alike), a right-to-left override that reverses what follows it, a word
// joiner, a byte-order mark, a line separator. In real Chromium: no script
// of the rogue's runs (html/template escapes it, the CSP forbids inline
// script), its markup reads as text, and every invisible character is
// shown escaped (\u200b, \u202e) on the leases, node, record and evidence
// pages and in the termination's live stream — so the operator sees two
// different jobs, and no cell is reordered.
func TestARoguesTextIsInertAndVisibleInTheBrowser(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	base := w.srv.URL
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	const xss = `"><script>window.pwned=1</script><img src=x onerror="window.pwned=2">`
	lookalike := "job-1\u200b"
	reversing := "job-2\u202e\u2060\ufeff\u2028" + xss
	// A job id whose link would walk out of /ui/jobs/: "x/../../nodes/<victim>?"
	// made "/ui/jobs/x/../../nodes/n_…?/evidence", the worker's node page.
	walker := "x/../../nodes/" + w.nodes["worker-2"].NodeId + "?"
	for _, job := range []string{lookalike, reversing, walker} {
		offered, err := w.admin.Lease.Offer(bg, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: rogueID, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatalf("offer %q: %v", job, err)
		}
		l := offered.Msg.Lease
		if _, err := rogue.Lease.Ack(bg, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
			t.Fatal(err)
		}
		if _, err := rogue.Lease.Progress(bg, connect.NewRequest(&tetherv1.ProgressRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: "40%\u202e" + xss})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rogue.Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: "stop\u200b " + xss + " terminated"})); err != nil {
		t.Fatal(err)
	}

	signInBrowser(t, ctx, base, w.srv.Admin)
	visible := func(what, path, ready string) string {
		t.Helper()
		run(t, ctx, what, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS(ready)))
		text := get(t, ctx, what+": the page's text", chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		if pwned := get(t, ctx, what+": did the rogue's script run", chromedp.Evaluate[bool](`window.pwned !== undefined || document.querySelector("main script, main img[onerror]") !== null`)); pwned {
			t.Fatalf("%s: the rogue's markup became live elements (script ran: %v)", what, pwned)
		}
		if i := strings.IndexFunc(text, invisibleRune); i >= 0 {
			t.Errorf("%s shows the rogue's invisible character %q as is:\n%q", what, []rune(text[i:])[0], text)
		}
		return text
	}
	text := visible("the leases page", "/ui/leases", "main table")
	for _, want := range []string{`job-1\u200b`, `job-2\u202e`, "<script>window.pwned=1</script>"} {
		if !strings.Contains(text, want) {
			t.Errorf("the leases page does not show %q:\n%s", want, text)
		}
	}
	links := get(t, ctx, "the evidence links", chromedp.Evaluate[[]string](`[...document.querySelectorAll('main a')].filter(a => a.textContent === "evidence matrix").map(a => new URL(a.href).pathname + new URL(a.href).search)`))
	want := "/ui/jobs/" + pathEscape(walker) + "/evidence"
	found := false
	for _, l := range links {
		found = found || l == want
		if !strings.HasPrefix(l, "/ui/jobs/") || !strings.HasSuffix(l, "/evidence") {
			t.Errorf("a job's evidence link leads to %s, out of /ui/jobs/", l)
		}
	}
	if !found {
		t.Errorf("no evidence link is %s; the links: %q", want, links)
	}
	visible("the walking job's evidence matrix", want, "#evidence")
	text = visible("the rogue's node page", "/ui/nodes/"+rogueID, "main h1")
	for _, want := range []string{`job-1\u200b`, `stop\u200b`, `<img src=x onerror="window.pwned=2">`} {
		if !strings.Contains(text, want) {
			t.Errorf("the rogue's node page does not show %q:\n%s", want, text)
		}
	}
	visible("the lookalike job's evidence matrix", "/ui/jobs/"+pathEscape(lookalike)+"/evidence", "#evidence")
	visible("the reversing job's evidence matrix", "/ui/jobs/"+pathEscape(reversing)+"/evidence", "#evidence")

	// The live revocation feed: the rogue delegates to a child it spawns and
	// revokes that grant with its own reason; the page's script puts the
	// event's reason into the table as text, escaped like the pages.
	run(t, ctx, "the revocation feed",
		chromedp.Navigate(base+"/ui/revocations"),
		chromedp.Poll[chromedp.Void](`document.querySelector("#feed-status").textContent === "Live."`),
	)
	kid, err := rogue.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogueID, Name: "kid"}))
	if err != nil {
		t.Fatal(err)
	}
	given, err := rogue.Capability.Delegate(bg, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: w.grants["rogue"], HolderNodeId: kid.Msg.Node.NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Capability.Revoke(bg, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: given.Msg.Grant.GrantId}, Reason: "fine\u202e\u200b" + xss})); err != nil {
		t.Fatal(err)
	}
	row := `#feed tbody tr:has(a[href="/ui/grants/` + given.Msg.Grant.GrantId + `"])`
	run(t, ctx, "the rogue's revocation arrives", chromedp.WaitVisible(chromedp.CSS(row)))
	reason := get(t, ctx, "the revocation's reason", chromedp.Evaluate[string](`document.querySelector('`+row+`').innerText`))
	if pwned := get(t, ctx, "did the rogue's script run", chromedp.Evaluate[bool](`window.pwned !== undefined || document.querySelector("#feed script, #feed img") !== null`)); pwned {
		t.Fatalf("the feed made the rogue's reason live markup")
	}
	if strings.IndexFunc(reason, invisibleRune) >= 0 || !strings.Contains(reason, `fine\u202e\u200b"><script>`) {
		t.Errorf("the feed shows the rogue's reason as %q, want its invisible characters escaped and its markup as text", reason)
	}

	// Stop worker-1's subtree; the rogue never confirms and is left
	// unaccounted, holding its jobs: the record names them escaped.
	term, err := w.admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["worker-1"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0), Reason: "rogue10",
	}))
	if err != nil {
		t.Fatal(err)
	}
	done := w.waitTermination(t, term.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	text = visible("the record", "/ui/records/"+done.RecordId, "#unaccounted")
	if !strings.Contains(text, `job-1\u200b`) || !strings.Contains(text, `job-2\u202e`) {
		t.Errorf("the record does not name the rogue's jobs escaped:\n%s", text)
	}
}

func invisibleRune(r rune) bool {
	return r != '\n' && r != '\t' && r != '\r' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) ||
		r == 0xad || (r >= 0x200b && r <= 0x200f) || (r >= 0x2028 && r <= 0x202e) || (r >= 0x2060 && r <= 0x206f) || r == 0xfeff)
}

func pathEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(string("0123456789abcdef"[c>>4])+string("0123456789abcdef"[c&15])))
	}
	return b.String()
}
