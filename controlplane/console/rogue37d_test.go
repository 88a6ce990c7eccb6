package console_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/console"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// countingConsole serves a console of its own whose calls go to the
// world's server in process (its own handler, as the control plane's
// console's do) and counts the nodes the ListNodes answers carried, and
// the calls it made of each procedure.
type countingConsole struct {
	mu       sync.Mutex
	answered int
	calls    map[string]int // by procedure name (GetRecord)
}

func (cc *countingConsole) start(t *testing.T, w *world) string {
	t.Helper()
	api := w.srv.Handler()
	ui, err := console.New(console.Config{API: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		cc.mu.Lock()
		if cc.calls == nil {
			cc.calls = map[string]int{}
		}
		cc.calls[path.Base(r.URL.Path)]++
		cc.mu.Unlock()
		if !strings.HasSuffix(r.URL.Path, "/ListNodes") {
			api.ServeHTTP(rw, r)
			return
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			plain := body
			if rec.Header().Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err == nil {
					plain, err = io.ReadAll(zr)
				}
				if err != nil {
					t.Errorf("a ListNodes answer: %v", err)
				}
			}
			var m tetherv1.ListNodesResponse
			if err := proto.Unmarshal(plain, &m); err != nil {
				t.Errorf("a ListNodes answer: %v", err)
			}
			cc.mu.Lock()
			cc.answered += len(m.Nodes)
			cc.mu.Unlock()
		}
		for k, v := range rec.Header() {
			rw.Header()[k] = v
		}
		rw.WriteHeader(rec.Code)
		_, _ = rw.Write(body)
	}), Now: w.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", ui)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL
}

// takeCalls is the calls of procedure the console made since the last
// takeCalls of it.
func (cc *countingConsole) takeCalls(procedure string) int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	n := cc.calls[procedure]
	delete(cc.calls, procedure)
	return n
}

func (cc *countingConsole) take() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	n := cc.answered
	cc.answered = 0
	return n
}

var filterNext = regexp.MustCompile(`href="(/ui/tree\?[^"]*after=[^"]*)"`)

// TestRogue37DAFilteredSubtreeViewReadsOnlyTheSubtree: a rogue under
// worker-1 spawns 2,630 nodes, each labelled team=research. The console's
// filtered view of worker-2's subtree (?root=, ?selector=team=research)
// paged through the whole tree's listing and kept worker-2's nodes: every
// one of the rogue's nodes was read and answered to it (pages of 500
// matches, up to ten a view) to show the one node of worker-2's subtree,
// so a rogue anywhere in the tree made an operator's view of a small
// subtree slow. The view now reads the subtree's own pages (ListNodes
// subtree_pages): worker-2 is shown and nothing of the rogue's is read
// for it. Within the rogue's own subtree the view still pages through
// every match, once each.
func TestRogue37DAFilteredSubtreeViewReadsOnlyTheSubtree(t *testing.T) {
	w := newWorld(t)
	growRogue(t, w)
	cc := &countingConsole{}
	b := newBrowser(t, cc.start(t, w))
	b.signIn(w.srv.Admin)
	cc.take()

	p := b.get("/ui/tree?root=" + w.nodes["worker-2"].NodeId + "&selector=team%3Dresearch")
	if p.status != http.StatusOK {
		t.Fatalf("filtered subtree view: %d\n%s", p.status, p.body)
	}
	if n := strings.Count(p.body, `<tr class="s-running">`); n != 1 || !strings.Contains(p.body, `>worker-2</a>`) {
		t.Fatalf("the filtered view of worker-2's subtree shows %d rows, want worker-2:\n%s", n, p.body)
	}
	if n := cc.take(); n > 10 {
		t.Fatalf("the filtered view of worker-2's one-node subtree was answered %d nodes by ListNodes: it read the rogue's", n)
	}

	// The rogue's own subtree, role=spawn: pages of matches, each a
	// link to the next within the subtree, every child once.
	seen := map[string]int{}
	path := "/ui/tree?root=" + w.nodes["rogue"].NodeId + "&selector=role%3Dspawn"
	for pages := 0; path != ""; pages++ {
		if pages > 8 {
			t.Fatal("the filtered view's pages do not end")
		}
		p := b.get(path)
		if p.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, p.status, p.body)
		}
		for _, n := range regexp.MustCompile(`>((?:spawn|grandchild)-\d+)</a>`).FindAllStringSubmatch(p.body, -1) {
			seen[n[1]]++
		}
		path = ""
		if m := filterNext.FindStringSubmatch(p.body); m != nil {
			path = html.UnescapeString(m[1])
			if !strings.Contains(path, "root="+w.nodes["rogue"].NodeId) {
				t.Fatalf("the next page's link leaves the subtree: %s", path)
			}
		}
	}
	if len(seen) != rogue35iChildren+30 {
		t.Fatalf("the filtered view's pages show %d of the rogue's %d nodes", len(seen), rogue35iChildren+30)
	}
	for name, n := range seen {
		if n != 1 {
			t.Fatalf("%s is shown %d times over the pages, want once", name, n)
		}
	}
}

// TestRogue37DASubtreePageResumesOnlyWithinTheSubtree: an agent's page
// of its own subtree resumed after a node outside it (page_token naming
// its uncle, or an id that names no node) is refused invalid_argument
// with the same words either way: the token neither lists elsewhere nor
// says whether the node exists.
func TestRogue37DASubtreePageResumesOnlyWithinTheSubtree(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	rogue := w.srv.Clients(w.creds["rogue"]).Agent
	page, err := rogue.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{SubtreePages: true, PageSize: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Msg.Nodes) != 1 || page.Msg.Nodes[0].NodeId != w.nodes["rogue"].NodeId {
		t.Fatalf("the rogue's first page of its own subtree: %v", page.Msg.Nodes)
	}
	var said []string
	for _, token := range []string{w.nodes["worker-2"].NodeId, w.nodes["planner"].NodeId, "n_00000000000000000000"} {
		_, err := rogue.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{SubtreePages: true, PageToken: token}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("the rogue's page after %s: %v, want invalid_argument", token, err)
		}
		said = append(said, err.Error())
	}
	if said[0] != said[1] || said[0] != said[2] {
		t.Fatalf("the refusals differ by whether the node exists: %q", said)
	}
	// Rooted outside its subtree: the page, like the whole listing, is
	// not_found, as an id that names nothing is.
	for _, root := range []string{w.nodes["worker-2"].NodeId, "n_00000000000000000000"} {
		_, err := rogue.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root, SubtreePages: true}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("the rogue's page of %s's subtree: %v, want not_found", root, err)
		}
	}
}

// TestRogue37DANodePageNamesItsAncestors: the rogue spawns a child named
// "worker-2" with the real worker-2's labels. The node page named a node,
// its state and its parent's id: the impostor's page read like worker-2's
// but for two ids, so an operator who reached it (from the filtered view,
// the quick find, a link) and meant to stop worker-2 pressed "Terminate
// worker-2" on the rogue's own child and left the real one running. The
// page now names the node's ancestors, root first, each a link: the
// impostor's reads planner › worker-1 › rogue, the real one's planner.
func TestRogue37DANodePageNamesItsAncestors(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	fake, err := w.srv.Clients(w.creds["rogue"]).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{
		ParentNodeId: w.nodes["rogue"].NodeId, Name: "worker-2", Labels: w.nodes["worker-2"].Labels,
	}))
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	link := func(name string) string {
		return `<a href="/ui/nodes/` + w.nodes[name].NodeId + `">` + name + `</a>`
	}
	pathOf := func(body string) string {
		i := strings.Index(body, `id="node-path"`)
		if i < 0 {
			t.Fatalf("the node page names no ancestors:\n%s", body)
		}
		j := strings.Index(body[i:], "</dd>")
		return body[i : i+j]
	}
	p := b.get("/ui/nodes/" + fake.Msg.Node.NodeId)
	if p.status != http.StatusOK {
		t.Fatalf("the impostor's page: %d\n%s", p.status, p.body)
	}
	path := pathOf(p.body)
	for _, name := range []string{"planner", "worker-1", "rogue"} {
		if !strings.Contains(path, link(name)) {
			t.Fatalf("the impostor's page does not name its ancestor %s:\n%s", name, path)
		}
	}
	if a, b := strings.Index(path, link("planner")), strings.Index(path, link("rogue")); a > b {
		t.Fatalf("the ancestors are not root first:\n%s", path)
	}
	p = b.get("/ui/nodes/" + w.nodes["worker-2"].NodeId)
	if path := pathOf(p.body); !strings.Contains(path, link("planner")) || strings.Contains(path, "rogue") {
		t.Fatalf("the real worker-2's ancestors:\n%s", path)
	}
}
