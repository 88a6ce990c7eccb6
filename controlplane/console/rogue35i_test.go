package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue35iChildren is how many children the rogue spawns under itself:
// well past a tree page's 500 nodes and a node page's 200 children, small
// enough for -race on a loaded machine.
const rogue35iChildren = 2600

// growRogue has the world's rogue spawn rogue35iChildren children under
// itself with its own credential (SpawnBatch, 200 a call), and its first
// 30 children of its own: what an agent may do within the tree's
// limits. A call its lineage's rate budget refuses is made again a
// second later on the manual clock.
func growRogue(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	spawn := func(cred, parent string, names []string) []*tetherv1.SpawnResponse {
		rogue := w.srv.Clients(cred)
		req := &tetherv1.SpawnBatchRequest{ParentNodeId: parent}
		for _, n := range names {
			req.Children = append(req.Children, &tetherv1.SpawnBatchChild{Name: n, Labels: map[string]string{"team": "research", "role": "spawn"}})
		}
		for range 100 {
			resp, err := rogue.Agent.SpawnBatch(ctx, connect.NewRequest(req))
			if connect.CodeOf(err) == connect.CodeResourceExhausted {
				w.clk.Advance(time.Second)
				continue
			}
			if err != nil {
				t.Fatalf("the rogue spawns: %v", err)
			}
			return resp.Msg.Spawned
		}
		t.Fatal("the rogue's budget never let it spawn")
		return nil
	}
	var first *tetherv1.SpawnResponse
	for i := 0; i < rogue35iChildren; i += 200 {
		var names []string
		for j := i; j < min(i+200, rogue35iChildren); j++ {
			names = append(names, fmt.Sprintf("spawn-%04d", j))
		}
		got := spawn(w.creds["rogue"], w.nodes["rogue"].NodeId, names)
		if first == nil {
			first = got[0]
		}
	}
	var names []string
	for j := range 30 {
		names = append(names, fmt.Sprintf("grandchild-%02d", j))
	}
	spawn(first.Credential, first.Node.NodeId, names)
}

var (
	treeRow  = regexp.MustCompile(`<li class="n [^"]*" data-name="([^"]*)"`)
	treeNext = regexp.MustCompile(`id="tree-next" href="([^"]*)"`)
)

// rows are the names of the tree nodes a page renders.
func rows(body string) []string {
	var out []string
	for _, m := range treeRow.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestRogue35ITreePagesReadOneLevelOfARoguesSubtree: a rogue grows its own
// subtree to 2,630 nodes. The landing tree page, its ancestors' pages and
// its own read and render one level a page at a time: at most 500 tree
// rows a page (before: every node of the tree, 2,635 rows, and a node's
// page listed its whole subtree); the rogue's children are all reachable
// through the pages' links, each once, and the label and state filters and
// ?root= still answer, a page at a time.
func TestRogue35ITreePagesReadOneLevelOfARoguesSubtree(t *testing.T) {
	w := newWorld(t)
	growRogue(t, w)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	rogueID := w.nodes["rogue"].NodeId

	// The landing page: bounded, the operator's own nodes and the rogue
	// on it, the rogue's children a link away.
	land := b.get("/ui/tree")
	if land.status != http.StatusOK {
		t.Fatalf("tree: %d\n%s", land.status, land.body)
	}
	got := rows(land.body)
	if len(got) > 500 {
		t.Fatalf("the landing page renders %d nodes of the rogue's subtree and the tree (at most 500 a page)", len(got))
	}
	for _, name := range []string{"planner", "worker-1", "worker-2", "helper", "rogue"} {
		if !strings.Contains(land.body, `data-name="`+name+`"`) {
			t.Errorf("the landing page does not show %s", name)
		}
	}
	if !strings.Contains(land.body, `href="/ui/tree?root=`) && !strings.Contains(land.body, "more children") {
		t.Errorf("the landing page links no further page of the rogue's children:\n%s", land.body)
	}

	// The rogue's ancestors' pages and its own list a page of children.
	for _, name := range []string{"planner", "worker-1", "rogue"} {
		p := b.get("/ui/nodes/" + w.nodes[name].NodeId)
		if p.status != http.StatusOK {
			t.Fatalf("%s's page: %d\n%s", name, p.status, p.body)
		}
		if n := strings.Count(p.body, `<li class="s-`); n > 200 {
			t.Errorf("%s's page lists %d children (at most 200)", name, n)
		}
	}
	rp := b.get("/ui/nodes/" + rogueID)
	if !strings.Contains(rp.body, fmt.Sprintf(`<span id="child-count">%d children</span>`, rogue35iChildren)) || !strings.Contains(rp.body, `id="children-more"`) {
		t.Errorf("the rogue's page does not count its %d children or link the rest:\n%s", rogue35iChildren, rp.body)
	}

	// ?root= the rogue: every child once, over bounded pages.
	seen := map[string]int{}
	pages := 0
	for next := "/ui/tree?root=" + rogueID; next != ""; pages++ {
		if pages > 20 {
			t.Fatal("the rogue's pages do not end")
		}
		p := b.get(next)
		if p.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", next, p.status, p.body)
		}
		r := rows(p.body)
		if len(r) > 501 {
			t.Fatalf("%s renders %d nodes (at most 500 and the rogue)", next, len(r))
		}
		for _, n := range r {
			seen[n]++
		}
		next = ""
		if m := treeNext.FindStringSubmatch(p.body); m != nil {
			next = html.UnescapeString(m[1])
		}
	}
	for i := range rogue35iChildren {
		if name := fmt.Sprintf("spawn-%04d", i); seen[name] != 1 {
			t.Fatalf("over the rogue's %d pages %s is shown %d times, want once", pages, name, seen[name])
		}
	}

	// The filters, a page at a time: role=spawn within the rogue's subtree.
	f := b.get("/ui/tree?selector=role%3Dspawn&state=running&root=" + rogueID)
	if f.status != http.StatusOK {
		t.Fatalf("filtered: %d\n%s", f.status, f.body)
	}
	if n := strings.Count(f.body, `<tr class="s-running">`); n == 0 || n > 1000 {
		t.Errorf("the filtered page shows %d matches (1 to 1000 a page)", n)
	}
	if !treeNext.MatchString(f.body) {
		t.Error("the filtered page links no next page of the rogue's 2,630 matches")
	}
	if strings.Contains(f.body, `>planner</a>`) {
		t.Error("the filtered subtree page shows a node outside the subtree")
	}
}

// TestRogue35IChromiumPagesThroughARoguesChildren: in Chromium, the
// operator opens the rogue's page (its first 200 children), follows "more
// children" to the tree page of the rest and pages through them to the
// last, seeing each child once, at most 500 a page.
func TestRogue35IChromiumPagesThroughARoguesChildren(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	growRogue(t, w)
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	run(t, ctx, "the rogue's page", chromedp.Navigate(w.srv.URL+"/ui/nodes/"+w.nodes["rogue"].NodeId), chromedp.WaitVisible(chromedp.CSS("#children-more")))
	first := get(t, ctx, "the rogue's children shown", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#children li a')).map(a => a.textContent)`))
	if len(first) == 0 || len(first) > 200 {
		t.Fatalf("the rogue's page shows %d children (1 to 200)", len(first))
	}
	seen := map[string]int{}
	for _, n := range first {
		seen[n]++
	}
	run(t, ctx, "more children", chromedp.Click(chromedp.CSS("#children-more")), chromedp.WaitVisible(chromedp.CSS("#tree-loaded")))
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("the pages do not end")
		}
		names := get(t, ctx, "the page's nodes", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#tree li.n')).map(li => li.dataset.name)`))
		if len(names) > 501 {
			t.Fatalf("a page renders %d nodes (at most 500 and the rogue)", len(names))
		}
		for _, n := range names {
			seen[n]++
		}
		more := get(t, ctx, "a next page", chromedp.Evaluate[bool](`!!document.querySelector('#tree-next')`))
		if !more {
			break
		}
		// The next page is read once its last element, after the tree,
		// is there (its summary comes before the tree: seen, it left a
		// page's nodes still to be parsed on a loaded machine).
		run(t, ctx, "the next page", chromedp.Evaluate[chromedp.Void](`document.querySelector('#tree-loaded').id = 'tree-loaded-old'`),
			chromedp.Click(chromedp.CSS("#tree-next")), chromedp.WaitVisible(chromedp.CSS("#tree-loaded")))
	}
	// The first were on the rogue's page; the pages after hold the rest.
	for i := range rogue35iChildren {
		if name := fmt.Sprintf("spawn-%04d", i); seen[name] != 1 {
			t.Fatalf("%s is shown %d times over the pages, want once", name, seen[name])
		}
	}
}
