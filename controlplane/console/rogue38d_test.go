package console_test

import (
	"context"
	"maps"
	"testing"

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
