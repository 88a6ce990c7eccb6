package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue40LGrantTreeIsReadAPageAtATime: the rogue delegates its grant
// to its child and revokes the delegation, again and again; revoked
// grants are kept, and each is derived from the operator's grant the
// rogue holds. The thirty-ninth pass made `tether grant ls` print a page
// at a time, but `tether grant tree` still read every page of the grant's
// derivation and drew it whole, so the operator who asked for the tree of
// the grant they issued waited for, and scrolled past, every grant the
// rogue ever delegated from it. It now draws at most --limit grants
// (1,000) from at most twenty listings, and when the derivation holds
// more, ends with the command that lists the rest (`tether grant ls
// --derived-from … --page-token …`), which pages through each grant once.
func TestRogue40LGrantTreeIsReadAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	const delegations = 4
	root := rogueDelegatesAndRevokes(t, w, delegations)
	out, err := cli(t, srv.URL, srv.Admin, "grant", "tree", root, "--limit", "2")
	if err != nil {
		t.Fatalf("tether grant tree --limit 2: %v (before the fix: no --limit, every page of the derivation read and drawn)", err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	more := lines[len(lines)-1]
	if !strings.HasPrefix(more, "… more: tether grant ls --page-token ") || !strings.Contains(more, "--derived-from "+root) {
		t.Fatalf("tether grant tree --limit 2 of %d grants ends %q, want the command that lists the rest:\n%s", 1+delegations, more, out)
	}
	drawn := lines[:len(lines)-1]
	if len(drawn) > 3 || !strings.HasPrefix(drawn[0], root+" ") {
		t.Fatalf("tether grant tree --limit 2 drew %d lines, want the grant %s first and at most 2 more:\n%s", len(drawn), root, out)
	}
	// The root is drawn whether or not the page held it (ids are random);
	// the grants below it are the page's, and the pages after hold the rest.
	seen := map[string]int{}
	for _, l := range drawn[1:] {
		for _, f := range strings.Fields(strings.TrimLeft(l, "│├└─ ")) {
			seen[f]++
			break
		}
	}
	args := strings.Fields(strings.TrimPrefix(more, "… more: tether "))
	for pages := 0; ; pages++ {
		if pages > delegations {
			t.Fatalf("tether grant ls from the tree's next page pages on past %d grants: %v", 1+delegations, seen)
		}
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		rows := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		next := ""
		if last := rows[len(rows)-1]; strings.HasPrefix(last, "… more: ") {
			next, rows = last, rows[:len(rows)-1]
		}
		for _, r := range rows[1:] {
			seen[strings.Fields(r)[0]]++
		}
		if next == "" {
			break
		}
		args = strings.Fields(strings.TrimPrefix(next, "… more: tether "))
	}
	if seen[root] == 0 {
		seen[root] = 1
	}
	if len(seen) != 1+delegations {
		t.Fatalf("the tree and the pages after it named %d grants, want %d: %v", len(seen), 1+delegations, seen)
	}
	for g, n := range seen {
		if n != 1 {
			t.Fatalf("grant %s named %d times: %v", g, n, seen)
		}
	}
	// Without --limit, a derivation of fewer than a thousand grants is
	// drawn whole, as before.
	out = mustCLI(t, srv.URL, srv.Admin, "grant", "tree", root)
	if n := strings.Count(out, "\n"); n != 1+delegations || strings.Contains(out, "… more") {
		t.Fatalf("tether grant tree drew %d lines, want %d and no next page:\n%s", n, 1+delegations, out)
	}
	if _, err := cli(t, srv.URL, srv.Admin, "grant", "tree", root, "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("tether grant tree --limit 0: %v, want a refusal naming --limit", err)
	}
}

// TestRogue40LGrantTreePageDrawsEachGrantItReadOnce: a page of a grant's
// derivation is in id order, which is random, so a grant's parent may be
// on a later page; such a grant is drawn below the root, naming its
// parent, rather than left out of both the tree and the pages after it.
func TestRogue40LGrantTreePageDrawsEachGrantItReadOnce(t *testing.T) {
	page := []*tetherv1.Grant{
		{GrantId: "g_b", ParentGrantId: "g_root", HolderNodeId: "n_1"},
		{GrantId: "g_d", ParentGrantId: "g_c", HolderNodeId: "n_2"},
		{GrantId: "g_e", ParentGrantId: "g_b", HolderNodeId: "n_3"},
		{GrantId: "g_root", HolderNodeId: "n_0"},
	}
	var out strings.Builder
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	cmd.SetContext(context.Background())
	if err := drawGrantTree(cmd, nil, "g_root", page); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"g_root", "g_b", "g_d", "g_e"} {
		if n := strings.Count(out.String(), g+" →"); n != 1 {
			t.Fatalf("grant %s drawn %d times, want once:\n%s", g, n, out.String())
		}
	}
	if !strings.Contains(out.String(), "g_d → n_2 [unspecified]  (under g_c, not drawn)") {
		t.Fatalf("the grant whose parent is not on the page does not name its parent:\n%s", out.String())
	}
}
