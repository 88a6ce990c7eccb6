package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"golang.org/x/text/unicode/norm"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// lookalikeJobs are job ids that read as "job-1" in a browser's fonts: a
// letter of another script in a Latin word, a word of look-alike letters
// of one script, an ASCII letter or digit drawn in another style.
var lookalikeJobs = []string{
	"\u0458ob-1",              // Cyrillic je
	"j\u043eb-1",              // Cyrillic o
	"j\u03bfb-1",              // Greek omicron
	"\u0458\u043e\u042c-1",    // Cyrillic je, o, soft sign: no Latin letter at all
	"\uff4a\uff4f\uff42-1",    // fullwidth
	"job-\U0001d7cf",          // mathematical bold one
	"job-\u0661",              // Arabic-Indic one
	"\U0001d5c3\U0001d5c8b-1", // mathematical sans-serif j and o
}

// skeleton is s as the eye takes it: each character that reads as an
// ASCII one replaced by it (the test's own list, from Unicode's
// confusables, and the compatibility forms).
func skeleton(s string) string {
	alike := map[rune]rune{0x0458: 'j', 0x043e: 'o', 0x03bf: 'o', 0x042c: 'b', 0x0661: '1', 0x0435: 'e', 0x0440: 'p', 0x0430: 'a', 0x0441: 'c'}
	var b strings.Builder
	for _, r := range norm.NFKC.String(s) {
		if a, ok := alike[r]; ok {
			r = a
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestARoguesJobIdsInOtherScriptsDoNotReadAsAnotherJob: a job id is any
// characters but control ones, and the console wrote out those drawn as
// nothing or as a blank, but not a letter that looks like another: the
// rogue holds "јob-1" (a Cyrillic je), "jоb-1" (a Cyrillic o), "ｊｏｂ-1"
// (fullwidth), "job-𝟏" (a mathematical one) … beside worker-1's "job-1",
// and in Chromium the leases page and the rogue's node page showed rows
// that each read "job-1"; its stop proposal's reason read as an operator's
// words. Each now reads as what it is ("\u0458ob-1"). (Fails if two
// different jobs read alike, or the reason reads as the rogue wrote it.)
func TestARoguesJobIdsInOtherScriptsDoNotReadAsAnotherJob(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	for _, job := range lookalikeJobs {
		offered, err := w.admin.Lease.Offer(bg, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: rogueID, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatalf("offer %q: %v", job, err)
		}
		l := offered.Msg.Lease
		if _, err := rogue.Lease.Ack(bg, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
			t.Fatal(err)
		}
	}
	const forgedReason = "s\u0430fe to \u0430pprove: \u0441le\u0430red by \u043ep\u0435r\u0430tor \u0430lice"
	if _, err := rogue.Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: forgedReason})); err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	check := func(what, path, cells string, want int) {
		t.Helper()
		run(t, ctx, what, chromedp.Navigate(w.srv.URL+path), chromedp.WaitVisible(chromedp.CSS("main table")))
		texts := get(t, ctx, what+": the job cells", chromedp.Evaluate[[]string](`[...document.querySelectorAll(`+jsString(cells)+`)].map(td => td.innerText)`))
		if len(texts) != want {
			t.Fatalf("%s shows %d jobs, want %d: %q", what, len(texts), want, texts)
		}
		seen := map[string]string{}
		for _, s := range texts {
			if other, ok := seen[skeleton(s)]; ok {
				t.Errorf("%s: the jobs shown as %q and %q both read %q", what, other, s, skeleton(s))
			}
			seen[skeleton(s)] = s
		}
	}
	check("the leases page", "/ui/leases", "#lease-list tbody tr td:first-child", len(lookalikeJobs)+1)
	check("the rogue's node page", "/ui/nodes/"+rogueID, "#leases tbody tr td:first-child", len(lookalikeJobs))
	// The node page is the last one loaded: its proposal's reason.
	reason := get(t, ctx, "the proposal's reason", chromedp.Evaluate[string](`document.querySelector("#proposals tbody tr td:nth-child(3)").innerText`))
	if strings.Contains(skeleton(reason), "cleared by operator") {
		t.Errorf("the rogue's reason reads %q, as if an operator had cleared it", reason)
	}
}

// TestANodesProposalsAreReadAloneAndDecidedByTheServersCheck: the node
// page and the console's Approve and Reject read every stop proposal the
// control plane holds (ListProposals had no node filter), decided ones
// included, to find one node's: a rogue that has its children propose and
// be rejected, again and again (each closed proposal stays stored), made
// every node page and every decision in the console carry all of them,
// 1 KiB of reason each. ListProposals now takes a node_id (a node's pending
// ones read from its own index); the node page asks for its node's only,
// and a decision no longer reads the list: DecideProposal's own check (the
// proposal is still pending) refuses a stale one, as the server said it.
// (Fails if a node's listing carries another node's proposals.)
func TestANodesProposalsAreReadAloneAndDecidedByTheServersCheck(t *testing.T) {
	w := newWorld(t)
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	for i := range 20 {
		child, err := rogue.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogueID, Name: fmt.Sprintf("c%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		p, err := w.srv.Clients(child.Msg.Credential).Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: strings.Repeat("R", 1024)}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.admin.Supervisor.DecideProposal(bg, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.Msg.Proposal.ProposalId})); err != nil {
			t.Fatal(err)
		}
	}
	own, err := rogue.Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: "mine"}))
	if err != nil {
		t.Fatal(err)
	}
	ownID := own.Msg.Proposal.ProposalId
	for _, state := range []tetherv1.ProposalState{tetherv1.ProposalState_PROPOSAL_STATE_UNSPECIFIED, tetherv1.ProposalState_PROPOSAL_STATE_PENDING} {
		got, err := w.admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: rogueID, State: state}))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Msg.Proposals) != 1 || got.Msg.Proposals[0].ProposalId != ownID {
			t.Errorf("ListProposals of the rogue's node (state %v) answers %d proposals, want its own one", state, len(got.Msg.Proposals))
		}
	}
	if got, err := w.admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: w.nodes["worker-2"].NodeId})); err != nil {
		t.Fatal(err)
	} else if n := len(got.Msg.Proposals); n != 0 {
		t.Errorf("ListProposals of worker-2, which proposed nothing, answers %d proposals", n)
	}

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_OPERATOR))
	p := b.get("/ui/nodes/" + rogueID)
	if table := proposalsTable.FindString(p.body); !strings.Contains(table, ownID) || strings.Count(table, "<tr>") != 2 {
		t.Fatalf("the rogue's node page does not show its one proposal alone:\n%s", table)
	}
	csrf := csrfField.FindStringSubmatch(p.body)[1]
	decide := func() page {
		return b.post("/ui/proposals/"+ownID+"/decide", url.Values{"csrf": {csrf}, "expected_state": {"pending"}, "decision": {"reject"}}, b.sameOrigin())
	}
	if r := decide(); r.status != http.StatusSeeOther || r.header.Get("Location") != "/ui/nodes/"+rogueID {
		t.Fatalf("rejecting the rogue's proposal: %d %s\n%s", r.status, r.header.Get("Location"), r.body)
	}
	// The same form again, from the page that showed it pending.
	r := decide()
	if r.status == http.StatusSeeOther || !strings.Contains(r.body, "rejected") || !strings.Contains(r.body, "Nothing was done") {
		t.Errorf("a decision from a page that showed a decided proposal pending: %d\n%s", r.status, r.body)
	}
}
