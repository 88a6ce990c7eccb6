package console_test

import (
	"context"
	"maps"
	"testing"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue39DQuickFindByAPartOfAnIDFindsThatNodeAlone: the rogue spawns
// two children: one named "worker-2", with worker-2's labels and one more
// whose value is worker-2's id, and one named after the start of
// worker-2's id (n_ and ten of its characters: not an id, so a name the
// server takes). An operator told to stop worker-2 has its id from a
// cut cell or a note ("n_8f3k2…") and types its start into the tree's
// quick find: a part of an id matched names and labels holding it, so
// both impostors were hits beside the real worker-2, one of them named
// worker-2. A query shaped like the start of a node id (n_ and up to
// nineteen characters of the ids' alphabet) now finds the nodes whose id
// begins with it, and no other.
func TestRogue39DQuickFindByAPartOfAnIDFindsThatNodeAlone(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	real := w.nodes["worker-2"].NodeId
	part := real[:12]
	rogue := w.srv.Clients(w.creds["rogue"]).Agent
	labels := maps.Clone(w.nodes["worker-2"].Labels)
	labels["ref"] = real
	byLabel, err := rogue.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{
		ParentNodeId: w.nodes["rogue"].NodeId, Name: "worker-2", Labels: labels,
	}))
	if err != nil {
		t.Fatal(err)
	}
	byName, err := rogue.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{
		ParentNodeId: w.nodes["rogue"].NodeId, Name: part,
	}))
	if err != nil {
		t.Fatalf("a name of n_ and ten characters of an id is not an id, so the server takes it: %v", err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	for _, n := range []*tetherv1.Node{byLabel.Msg.Node, byName.Msg.Node} {
		run(t, ctx, "the tree shows the impostor "+n.Name, chromedp.WaitVisible(chromedp.CSS(`li.n[data-id="`+n.NodeId+`"] a`)))
	}
	run(t, ctx, "find worker-2 by the start of its id", chromedp.SendKeys(chromedp.CSS("#quick"), part),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
	hits := get(t, ctx, "the quick find's hits", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tree li.n.hit')].map((li) => li.dataset.id)`))
	if len(hits) != 1 || hits[0] != real {
		t.Fatalf("finding worker-2 by the start of its id %s hits %v, want %s alone (the rogue's children %s, labelled with worker-2's id, and %s, named %s, are not it)",
			part, hits, real, byLabel.Msg.Node.NodeId, byName.Msg.Node.NodeId, part)
	}
	// A name that is not the start of an id still finds every node of
	// that name, the impostor included (names are not unique; its node
	// page names its ancestors), and a label value too.
	run(t, ctx, "find by name", chromedp.Evaluate[chromedp.Void](`document.querySelector("#quick").value = ""`), chromedp.SendKeys(chromedp.CSS("#quick"), "worker-2"),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+byLabel.Msg.Node.NodeId+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
}
