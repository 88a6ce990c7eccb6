package console_test

import (
	"context"
	"html"
	"maps"
	"net/http"
	"strings"
	"testing"
	"unicode"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue38DQuickFindByIDFindsThatNodeAlone: the rogue spawns a child
// named "worker-2", with worker-2's labels and one more whose value is
// worker-2's id. An operator told to stop worker-2 by its id pastes the id
// into the tree's quick find ("find by name, id or label"), which matched
// it against every node's name, id and labels alike: the impostor, three
// levels down, was a hit as the real worker-2 was, both named worker-2,
// and the one the operator opened and stopped may be the rogue's own
// child, the real worker-2 left running. A query shaped like a node id now
// finds the node whose id it is, and no other.
func TestRogue38DQuickFindByIDFindsThatNodeAlone(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	real := w.nodes["worker-2"].NodeId
	labels := maps.Clone(w.nodes["worker-2"].Labels)
	labels["ref"] = real
	fake, err := w.srv.Clients(w.creds["rogue"]).Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{
		ParentNodeId: w.nodes["rogue"].NodeId, Name: "worker-2", Labels: labels,
	}))
	if err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	run(t, ctx, "the tree shows the impostor", chromedp.WaitVisible(chromedp.CSS(`li.n[data-id="`+fake.Msg.Node.NodeId+`"] a`)))
	run(t, ctx, "find worker-2 by its id", chromedp.SendKeys(chromedp.CSS("#quick"), real),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
	hits := get(t, ctx, "the quick find's hits", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tree li.n.hit')].map((li) => li.dataset.id)`))
	if len(hits) != 1 || hits[0] != real {
		t.Fatalf("finding worker-2 by its id %s hits %v, want it alone (the rogue's child %s labelled with that id is not it)", real, hits, fake.Msg.Node.NodeId)
	}
	shown := get(t, ctx, "is the impostor shown", chromedp.Evaluate[bool](`!document.querySelector('li.n[data-id="`+fake.Msg.Node.NodeId+`"]').closest('li.n[hidden]') && document.querySelector('li.n[data-id="`+fake.Msg.Node.NodeId+`"]').checkVisibility()`))
	if shown {
		t.Fatal("finding worker-2 by its id still shows the rogue's child named worker-2")
	}
	// A name still finds every node of that name, the impostor included
	// (names are not unique; its node page names its ancestors).
	run(t, ctx, "find by name", chromedp.Evaluate[chromedp.Void](`document.querySelector("#quick").value = ""`), chromedp.SendKeys(chromedp.CSS("#quick"), "worker-2"),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+fake.Msg.Node.NodeId+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
}

// TestRogue38DAStackOfMarksCannotDrawOverOtherRows: the rogue proposes its
// own stop with a reason of "ok" and five hundred combining marks (a
// kilobyte), each drawn above or below the one before. A page showed them
// as they were, and the browser stacked them over the rows above and
// below the rogue's, striking through other nodes' cells (another
// proposal's state, a record's UNACCOUNTED). A run of combining marks
// longer than printable.MaxMarks is now written out past its first
// MaxMarks (\u0300), as the CLI writes it.
func TestRogue38DAStackOfMarksCannotDrawOverOtherRows(t *testing.T) {
	w := newWorld(t)
	var marks strings.Builder
	for i := 0; marks.Len() < 1000; i++ {
		marks.WriteRune(rune(0x300 + i%0x70))
	}
	if _, err := w.srv.Clients(w.creds["rogue"]).Agent.ProposeStop(context.Background(), connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "calls>=1", Reason: "ok" + marks.String(),
	})); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	p := b.get("/ui/nodes/" + w.nodes["rogue"].NodeId)
	if p.status != http.StatusOK {
		t.Fatalf("the rogue's page: %d\n%s", p.status, p.body)
	}
	text := html.UnescapeString(p.body)
	if !strings.Contains(text, `ok`) || !strings.Contains(text, `\u0300`) {
		t.Fatalf("the rogue's page does not show its reason with its marks written out:\n%.3000s", text)
	}
	run, longest := 0, 0
	for _, r := range text {
		if unicode.In(r, unicode.Mn, unicode.Me) {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	if longest > 4 {
		t.Fatalf("the rogue's page shows %d combining marks in a row, to be stacked over the rows beside its own", longest)
	}
}

// TestRogue38DFilteredViewNamesEachNodesAncestors: the rogue spawns a
// child named "worker-2" with the real worker-2's labels. The tree's
// filtered view (a label selector), what an operator stopping the workers
// reads, showed each match's name, state, labels, id and parent's id: the
// two worker-2 rows read alike but for two ids. Each row now names the
// node's ancestors, root first: planner/worker-1/rogue for the impostor,
// planner for the real one.
func TestRogue38DFilteredViewNamesEachNodesAncestors(t *testing.T) {
	w := newWorld(t)
	fake, err := w.srv.Clients(w.creds["rogue"]).Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{
		ParentNodeId: w.nodes["rogue"].NodeId, Name: "worker-2", Labels: w.nodes["worker-2"].Labels,
	}))
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	for _, q := range []string{"/ui/tree?selector=role%3Dworker", "/ui/tree?selector=role%3Dworker&root=" + w.nodes["planner"].NodeId} {
		p := b.get(q)
		if p.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", q, p.status, p.body)
		}
		row := func(id string) string {
			for _, tr := range strings.Split(p.body, "<tr") {
				if strings.Contains(tr, "<code>"+id+"</code></td>") {
					return tr
				}
			}
			t.Fatalf("%s does not list %s:\n%s", q, id, p.body)
			return ""
		}
		if r := row(w.nodes["worker-2"].NodeId); !strings.Contains(r, `<td class="path">planner</td>`) {
			t.Fatalf("%s: the real worker-2's row does not name its path planner:\n%s", q, r)
		}
		if r := row(fake.Msg.Node.NodeId); !strings.Contains(r, `<td class="path">planner/worker-1/rogue</td>`) {
			t.Fatalf("%s: the rogue's worker-2's row does not name its path planner/worker-1/rogue:\n%s", q, r)
		}
	}
}
