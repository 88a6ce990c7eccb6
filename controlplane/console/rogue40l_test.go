package console_test

import (
	"context"
	"maps"
	"testing"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue40LQuickFindByAPartFromAnIDsMiddleFindsThatNodeAlone: the
// thirty-ninth pass made a query shaped like the START of a node id (n_
// and some of its characters) find the nodes whose id begins with it
// alone. An operator who copied worker-2's id from a cut cell or a
// wrapped line has a part of it without its "n_" ("8f3k2…" from the
// middle), and a part from an id's middle still matched names and labels
// holding it: the rogue's child named after that part, and its child
// named "worker-2" labelled ref=<worker-2's id>, were hits beside the
// real worker-2. A query of at least six of the ids' characters that is a
// part of a shown node's id now finds the nodes whose id holds it, and no
// other.
func TestRogue40LQuickFindByAPartFromAnIDsMiddleFindsThatNodeAlone(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	real := w.nodes["worker-2"].NodeId
	part := real[4:16]
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
		t.Fatalf("a name of twelve characters from an id's middle is not an id, so the server takes it: %v", err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	for _, n := range []*tetherv1.Node{byLabel.Msg.Node, byName.Msg.Node} {
		run(t, ctx, "the tree shows the impostor "+n.Name, chromedp.WaitVisible(chromedp.CSS(`li.n[data-id="`+n.NodeId+`"] a`)))
	}
	run(t, ctx, "find worker-2 by a part from its id's middle", chromedp.SendKeys(chromedp.CSS("#quick"), part),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
	hits := get(t, ctx, "the quick find's hits", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tree li.n.hit')].map((li) => li.dataset.id)`))
	if len(hits) != 1 || hits[0] != real {
		t.Fatalf("finding worker-2 by the part %s from its id's middle hits %d nodes %v, want %s alone (the rogue's children %s, labelled with worker-2's id, and %s, named %s, are not it)",
			part, len(hits), hits, real, byLabel.Msg.Node.NodeId, byName.Msg.Node.NodeId, part)
	}
	// A name no shown id holds still finds every node of that name, the
	// impostor included (names are not unique; its node page names its
	// ancestors), and so does a short query.
	run(t, ctx, "find by name", chromedp.Evaluate[chromedp.Void](`document.querySelector("#quick").value = ""`), chromedp.SendKeys(chromedp.CSS("#quick"), "worker-2"),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+byLabel.Msg.Node.NodeId+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
}
