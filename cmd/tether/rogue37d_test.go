package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// listAnswers serves api (a test server's own handler) on a server of its
// own, speaking h2c as the control plane does, and notes how many nodes
// each ListNodes answer carried.
type listAnswers struct {
	mu    sync.Mutex
	nodes []int
}

func (l *listAnswers) serve(t *testing.T, api http.Handler) string {
	t.Helper()
	return serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/ListNodes") {
			api.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			plain := body
			if rec.Header().Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Errorf("a ListNodes answer: %v", err)
					return
				}
				if plain, err = io.ReadAll(zr); err != nil {
					t.Errorf("a ListNodes answer: %v", err)
					return
				}
			}
			var m tetherv1.ListNodesResponse
			if err := proto.Unmarshal(plain, &m); err != nil {
				t.Errorf("a ListNodes answer: %v", err)
				return
			}
			l.mu.Lock()
			l.nodes = append(l.nodes, len(m.Nodes))
			l.mu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	}))
}

func (l *listAnswers) most() (calls, most int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.nodes {
		most = max(most, n)
	}
	return len(l.nodes), most
}

// TestRogue37DTheCLIListsASubtreeAPageAtATime: a rogue spawns 1,200
// children under itself. `tether agent ls --root` on its ancestor asked
// the server for the whole subtree in one answer (1,203 nodes) and printed
// --limit of them: a rogue with about 3,800 children carrying every label
// allowed made that answer larger than the 16 MiB a client reads, and the
// operator's listing of the rogue's ancestor failed. The CLI now reads the
// subtree a page at a time (ListNodes subtree_pages), each answer at most
// --limit nodes, and prints the --page-token (with --root) of the next
// page; following the hints lists every node of the subtree once, and the
// pages of a subtree name only its nodes.
func TestRogue37DTheCLIListsASubtreeAPageAtATime(t *testing.T) {
	srv, planner, rogue := rogue36dWorld(t)
	seen := &listAnswers{}
	url := seen.serve(t, srv.Handler())

	rows := map[string]int{}
	out := mustCLI(t, url, srv.Admin, "agent", "ls", "--root", planner, "--limit", "300")
	for pages := 0; ; pages++ {
		if pages > 6 {
			t.Fatal("the subtree's pages do not end")
		}
		if n := strings.Count(out, "\n"); n > 302 {
			t.Fatalf("a page of --limit 300 prints %d lines", n)
		}
		for line := range strings.Lines(out) {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "n_") {
				rows[f[1]]++
			}
		}
		m := lsMore.FindStringSubmatch(out)
		if m == nil {
			break
		}
		if !strings.Contains(out, "--root "+planner) {
			t.Fatalf("the hint does not keep --root:\n%s", out[strings.LastIndex(out, "…"):])
		}
		out = mustCLI(t, url, srv.Admin, "agent", "ls", "--root", planner, "--limit", "300", "--page-token", m[1])
	}
	for _, name := range []string{"planner", "worker", "rogue"} {
		if rows[name] != 1 {
			t.Fatalf("over the subtree's pages %s is listed %d times, want once", name, rows[name])
		}
	}
	for i := range rogue36dChildren {
		if name := fmt.Sprintf("spawn-%04d", i); rows[name] != 1 {
			t.Fatalf("over the subtree's pages %s is listed %d times, want once", name, rows[name])
		}
	}
	if calls, most := seen.most(); most > 300 {
		t.Fatalf("an answer to `agent ls --root --limit 300` carried %d nodes (%d calls): the subtree was answered whole", most, calls)
	}

	// A page of the rogue's subtree resumed from a node outside it is
	// refused, never a listing of elsewhere.
	level, err := srv.AdminClients().Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: planner, OneLevel: true}))
	if err != nil {
		t.Fatal(err)
	}
	worker := ""
	for _, n := range level.Msg.Nodes {
		if n.Name == "worker" {
			worker = n.NodeId
		}
	}
	if _, err := cli(t, url, srv.Admin, "agent", "ls", "--root", rogue, "--page-token", worker); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "page_token") {
		t.Fatalf("a page of the rogue's subtree after the worker: %v, want invalid_argument naming page_token", err)
	}
}

// TestRogue37DARoguesTabCannotForgeACellOfTheOperatorsTable: the CLI's
// tables keep the tabs that separate their cells and wrote out every
// other control character of an agent's text, so a tab in what the rogue
// wrote ended its cell and began the next one: its stop proposal's reason
// "calm\tt_forged" made a row of `tether proposal ls` whose REASON read
// "calm" and whose TERMINATION named a termination that does not exist,
// as if the proposal had been approved and its stop started. Each cell is
// now written out whole (a tab within it as \t): the row has as many
// cells as its header.
func TestRogue37DARoguesTabCannotForgeACellOfTheOperatorsTable(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	if _, err := w.rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: "calm\tt_forged"})); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls")
	if !strings.Contains(out, "calm") {
		t.Fatalf("tether proposal ls does not show the rogue's reason:\n%s", out)
	}
	if !strings.Contains(out, `calm\tt_forged`) {
		t.Fatalf("tether proposal ls prints the rogue's t_forged as a cell of its own:\n%s", out)
	}
	// -o json carries the reason as written.
	if out := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls", "-o", "json"); !strings.Contains(out, `calm\tt_forged`) {
		t.Fatalf("tether proposal ls -o json does not carry the reason as written:\n%s", out)
	}
}

// TestRogue37DAgentShowNamesTheAncestors: the rogue ("worker", under
// root) spawns a child named "root". `tether agent show` printed a node's
// name and its parent's id only, so the impostor read as the root but for
// two ids, and an operator who meant to stop the root's tree and checked
// the node first stopped the rogue's child. It now prints the node's
// path, root first, each ancestor by name and id.
func TestRogue37DAgentShowNamesTheAncestors(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	fake, err := w.rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.child.Node.NodeId, Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	root := w.child.Node.Ancestors[0]
	out := mustCLI(t, srv.URL, srv.Admin, "agent", "show", fake.Msg.Node.NodeId)
	want := "path:     root (" + root + ") / worker (" + w.child.Node.NodeId + ") / root\n"
	if !strings.Contains(out, want) {
		t.Fatalf("tether agent show of the rogue's child named root does not print its path %q:\n%s", want, out)
	}
	if out := mustCLI(t, srv.URL, srv.Admin, "agent", "show", root); !strings.Contains(out, "path:     root\n") {
		t.Fatalf("tether agent show of the root does not print it as a root:\n%s", out)
	}
}
