package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue36dChildren: past a CLI page (a tree's 500 nodes, a listing's
// 1,000), small enough for -race on a loaded machine.
const rogue36dChildren = 1200

// rogue36dWorld is a planner with a worker and a rogue that spawned
// rogue36dChildren children under itself with its own credential
// (SpawnBatch, 200 a call; a call its budget refuses is made again a
// second later on the manual clock).
func rogue36dWorld(t *testing.T) (srv *testserver.Server, planner, rogue string) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv = testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	parent := srv.Clients(root.Msg.Credential)
	if _, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker"})); err != nil {
		t.Fatal(err)
	}
	r, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	own := srv.Clients(r.Msg.Credential)
	for i := 0; i < rogue36dChildren; i += 200 {
		req := &tetherv1.SpawnBatchRequest{ParentNodeId: r.Msg.Node.NodeId}
		for j := i; j < min(i+200, rogue36dChildren); j++ {
			req.Children = append(req.Children, &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("spawn-%04d", j)})
		}
		for tries := 0; ; tries++ {
			_, err := own.Agent.SpawnBatch(ctx, connect.NewRequest(req))
			if connect.CodeOf(err) == connect.CodeResourceExhausted && tries < 100 {
				clk.Advance(time.Second)
				continue
			}
			if err != nil {
				t.Fatalf("the rogue spawns: %v", err)
			}
			break
		}
	}
	return srv, root.Msg.Node.NodeId, r.Msg.Node.NodeId
}

var (
	spawnName = regexp.MustCompile(`spawn-\d{4}`)
	treeMore  = regexp.MustCompile(`tether agent tree (n_\w+) --after (n_\w+)`)
	lsMore    = regexp.MustCompile(`--page-token (n_\w+)`)
)

// TestRogue36DTheCLIListsARoguesSubtreeAPageAtATime: a rogue spawns 1,200
// children under itself. `tether agent tree` on its ancestor read the whole
// subtree in one answer and drew every node (1,203 lines), and
// `tether agent ls` read and printed every node of the tree: the operator
// who meant to find and stop the rogue waited for and scrolled past all
// it spawned. `agent tree` now reads one level at a time, breadth first,
// at most --limit nodes (500 by default), and names the command that
// shows the rest (the rogue's next children, --after); `agent ls` prints
// --limit nodes (1,000 by default) and the --page-token of the next page.
// Following the hints reaches every child once.
func TestRogue36DTheCLIListsARoguesSubtreeAPageAtATime(t *testing.T) {
	srv, planner, rogue := rogue36dWorld(t)

	out := mustCLI(t, srv.URL, srv.Admin, "agent", "tree", planner)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) > 503 {
		t.Fatalf("tether agent tree on the rogue's ancestor draws %d lines (at most 500 nodes, the planner and a hint)", len(lines))
	}
	for _, want := range []string{"planner (" + planner + ") [running]", "worker (", "rogue (" + rogue + ") [running]"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the tree does not show %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("%d children", rogue36dChildren)) {
		t.Fatalf("the tree does not count the rogue's %d children:\n%s", rogue36dChildren, out)
	}
	seen := map[string]int{}
	next := treeMore.FindStringSubmatch(out)
	for _, n := range spawnName.FindAllString(out, -1) {
		seen[n]++
	}
	for pages := 0; next != nil; pages++ {
		if pages > 10 || next[1] != rogue {
			t.Fatalf("the tree's hints do not end or name another node: %v", next)
		}
		out = mustCLI(t, srv.URL, srv.Admin, "agent", "tree", next[1], "--after", next[2])
		if n := strings.Count(out, "\n"); n > 502 {
			t.Fatalf("a page of the rogue's children draws %d lines", n)
		}
		for _, n := range spawnName.FindAllString(out, -1) {
			seen[n]++
		}
		next = treeMore.FindStringSubmatch(out)
	}
	for i := range rogue36dChildren {
		if name := fmt.Sprintf("spawn-%04d", i); seen[name] != 1 {
			t.Fatalf("over the tree's pages %s is drawn %d times, want once", name, seen[name])
		}
	}
	// A small --limit: the rogue's children are a command away.
	out = mustCLI(t, srv.URL, srv.Admin, "agent", "tree", planner, "--limit", "2")
	if strings.Contains(out, "spawn-") || !strings.Contains(out, "tether agent tree "+rogue) {
		t.Fatalf("with --limit 2 the tree draws the rogue's children or names no command for them:\n%s", out)
	}

	// agent ls: a page of a thousand and the next page's token.
	seen = map[string]int{}
	out = mustCLI(t, srv.URL, srv.Admin, "agent", "ls")
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("the listing's pages do not end")
		}
		if rows := strings.Count(out, "\n"); rows > 1002 {
			t.Fatalf("tether agent ls prints %d lines (a header, 1,000 nodes and a hint at most)", rows)
		}
		for _, n := range spawnName.FindAllString(out, -1) {
			seen[n]++
		}
		m := lsMore.FindStringSubmatch(out)
		if m == nil {
			break
		}
		out = mustCLI(t, srv.URL, srv.Admin, "agent", "ls", "--page-token", m[1])
	}
	for i := range rogue36dChildren {
		if name := fmt.Sprintf("spawn-%04d", i); seen[name] != 1 {
			t.Fatalf("over the listing's pages %s is listed %d times, want once", name, seen[name])
		}
	}
	if _, err := cli(t, srv.URL, srv.Admin, "agent", "ls", "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("--limit 0: %v, want an error naming --limit", err)
	}
}
