package console_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/console"
	"github.com/tetherhq/tether/controlplane/testserver"

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
	quickFindByAPartOfAnID(t, "the start of its id", func(id string) string { return id[:12] })
}

// quickFindByAPartOfAnID: the rogue spawns a child named "worker-2",
// with worker-2's labels and one more whose value is worker-2's id, and
// one named after a part of worker-2's id (which, not being an id, is a
// name the server takes); the operator types that part into the tree's
// quick find, and only the real worker-2 is a hit. A name that is no
// id's part still finds every node of that name.
func quickFindByAPartOfAnID(t *testing.T, what string, partOf func(id string) string) {
	ctx := chrome(t)
	w := newWorld(t)
	real := w.nodes["worker-2"].NodeId
	part := partOf(real)
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
		t.Fatalf("a name made of %s (%s) is not an id, so the server takes it: %v", what, part, err)
	}
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	for _, n := range []*tetherv1.Node{byLabel.Msg.Node, byName.Msg.Node} {
		run(t, ctx, "the tree shows the impostor "+n.Name, chromedp.WaitVisible(chromedp.CSS(`li.n[data-id="`+n.NodeId+`"] a`)))
	}
	run(t, ctx, "find worker-2 by "+what, chromedp.SendKeys(chromedp.CSS("#quick"), part),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
	hits := get(t, ctx, "the quick find's hits", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tree li.n.hit')].map((li) => li.dataset.id)`))
	if len(hits) != 1 || hits[0] != real {
		t.Fatalf("finding worker-2 by %s %s hits %d nodes %v, want %s alone (the rogue's children %s, labelled with worker-2's id, and %s, named %s, are not it)",
			what, part, len(hits), hits, real, byLabel.Msg.Node.NodeId, byName.Msg.Node.NodeId, part)
	}
	// A name no shown id holds still finds every node of that name, the
	// impostor included (names are not unique; its node page names its
	// ancestors), and a label value too.
	run(t, ctx, "find by name", chromedp.Evaluate[chromedp.Void](`document.querySelector("#quick").value = ""`), chromedp.SendKeys(chromedp.CSS("#quick"), "worker-2"),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+byLabel.Msg.Node.NodeId+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`li.n.hit[data-id="`+real+`"]`)))
}

// TestRogue39DARecordPageDrawsAPageOfARoguesSubtree: the rogue spawns
// children (as many as its lineage's budget and MaxChildren allow: a
// hundred thousand in the thirty-fifth pass's reckoning), none of which
// ever confirms its exit. The operator stops worker-1, the rogue's
// parent; the record lists every node of the subtree, and the record page
// drew each in its Agents table and each unaccounted one in Needs
// attention: a row per node of the rogue's, a page of megabytes for the
// operator who came to read their own stop's outcome. Each of the page's
// lists now draws console.RecordRows rows (500) and says how many more
// there are and where they are listed whole (the JSON, tether record
// show); its counts are still of the whole record.
func TestRogue39DARecordPageDrawsAPageOfARoguesSubtree(t *testing.T) {
	defer func(n int) { console.RecordRows = n }(console.RecordRows)
	console.RecordRows = 3
	w := newWorld(t)
	const kids = 5
	done, nodes, unaccounted := stopTheRoguesParent(t, w, kids)
	if nodes < 3+kids || unaccounted <= 3 {
		t.Fatalf("the record of worker-1's stop lists %d nodes, %d unaccounted: want worker-1, helper, the rogue and its %d children, more than 3 unaccounted", nodes, unaccounted, kids)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	p := b.get("/ui/records/" + done.RecordId)
	if p.status != http.StatusOK {
		t.Fatalf("the record page: %d\n%s", p.status, p.body)
	}
	rows := func(table string) int {
		i := strings.Index(p.body, `id="`+table+`"`)
		if i < 0 {
			t.Fatalf("the record page has no table %s:\n%s", table, p.body)
		}
		body := p.body[i:]
		body = body[:strings.Index(body, "</table>")]
		return strings.Count(body, "<tr") - 1 // its heading's row
	}
	if n := rows("record-nodes"); n != 3 {
		t.Fatalf("the record page's Agents table draws %d rows of the record's %d nodes, want console.RecordRows (3)", n, nodes)
	}
	if n := rows("unaccounted"); n != 3 {
		t.Fatalf("the record page's unaccounted agents draw %d rows of %d, want console.RecordRows (3)", n, unaccounted)
	}
	for _, want := range []string{
		fmt.Sprintf("Agents (%d confirmed, %d unaccounted)", nodes-unaccounted, unaccounted),
		fmt.Sprintf("Unaccounted agents (%d)", unaccounted),
		fmt.Sprintf("And %d more agents", nodes-3),
		fmt.Sprintf("And %d more unaccounted agents", unaccounted-3),
		"tether record show " + done.RecordId,
	} {
		if !strings.Contains(p.body, want) {
			t.Fatalf("the record page does not say %q:\n%s", want, p.body)
		}
	}
}

// stopTheRoguesParent: the rogue spawns kids children, none of which ever
// confirms its exit, and the operator aborts worker-1, the rogue's
// parent. It returns the termination, its record written, and the
// record's nodes and unaccounted ones (read whole).
func stopTheRoguesParent(t *testing.T, w *world, kids int) (done *tetherv1.Termination, nodes, unaccounted int) {
	t.Helper()
	ctx := context.Background()
	rogue := w.srv.Clients(w.creds["rogue"]).Agent
	for i := range kids {
		if _, err := rogue.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.nodes["rogue"].NodeId, Name: fmt.Sprintf("kid-%d", i)})); err != nil {
			t.Fatal(err)
		}
	}
	term, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["worker-1"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0),
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	// Aborting, or past it already (its deadlines are zero); then past
	// every deadline.
	testserver.WaitFor(t, 20*time.Second, "termination "+id+" to abort", func() bool {
		got, err := w.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.State >= tetherv1.TerminationState_TERMINATION_STATE_ABORTING
	})
	w.clk.Advance(time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the record", func() bool {
		got, err := w.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		done = got.Msg.Termination
		return done.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED && done.RecordId != ""
	})
	rec, err := agentsdk.ReadRecord(ctx, w.admin.Supervisor, &tetherv1.GetRecordRequest{RecordId: done.RecordId})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rec.Nodes {
		if n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
			unaccounted++
		}
	}
	return done, len(rec.Nodes), unaccounted
}
