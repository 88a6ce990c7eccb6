package console_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestTheFeedPageGivesTheTombstonesItSkippedAPageOfTheirOwn: the live
// feed page shows the newest 500 tombstones and, behind a rogue's flood
// of revocations, skips to the newest 500 again (grantstore's
// TestADisplayFollowerBehindARevocationFloodSkipsToTheNewest); what it
// does not show is a page away: its "older" link opens ?before= the
// oldest row it shows, the 500 live tombstones below it, newest first,
// server-rendered, with its own link further back. (Fails if the link is
// missing or the page does not carry the tombstones below the live
// page's, or a bad ?before= is not refused.)
func TestTheFeedPageGivesTheTombstonesItSkippedAPageOfTheirOwn(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	rogue := w.srv.Clients(w.creds["rogue"])
	// Three sinks of 200 grants each: a node holds at most 256 live grants
	// delegated by agents (--grant-max-per-node).
	const grants, sinks = 600, 3
	var revoked *connect.Response[tetherv1.RevokeResponse]
	for s := range sinks {
		child, err := rogue.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.nodes["rogue"].NodeId, Name: fmt.Sprintf("sink-%d", s)}))
		if err != nil {
			t.Fatal(err)
		}
		for i := range grants / sinks {
			if _, err := rogue.Capability.Delegate(bg, connect.NewRequest(&tetherv1.DelegateRequest{
				ParentGrantId: w.grants["rogue"], HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(10 * time.Minute),
			})); err != nil {
				t.Fatalf("delegation %d to sink %d: %v", i, s, err)
			}
		}
		if revoked, err = rogue.Capability.Revoke(bg, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Msg.Node.NodeId}, Reason: "churn"})); err != nil {
			t.Fatal(err)
		}
	}
	head := revoked.Msg.Sequence
	oldestShown := head - 499

	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	run(t, ctx, "the feed page", chromedp.Navigate(w.srv.URL+"/ui/revocations"), chromedp.WaitVisible(chromedp.CSS("#feed")))
	run(t, ctx, "the feed going live", chromedp.Poll[chromedp.Void](`document.querySelector("#feed-status").textContent === "Live."`))
	href := get(t, ctx, "the older link", chromedp.Evaluate[string](`(l => l.hidden ? "" : l.getAttribute("href"))(document.querySelector("#feed-older"))`))
	if want := fmt.Sprintf("/ui/revocations?before=%d", oldestShown); href != want {
		t.Fatalf("the live feed page's older link is %q, want %q", href, want)
	}
	run(t, ctx, "the older page", chromedp.Click(chromedp.CSS("#feed-older")), chromedp.WaitVisible(chromedp.CSS("#feed-page")))
	rows := get(t, ctx, "the older page's rows", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#feed-page tbody tr td:first-child")].map(td => td.textContent)`))
	want := min(500, int(oldestShown-1))
	if len(rows) != want || rows[0] != fmt.Sprint(oldestShown-1) || rows[len(rows)-1] != fmt.Sprint(oldestShown-uint64(want)) {
		t.Fatalf("the older page shows %d rows, first %q, last %q; want %d, %d down to %d", len(rows), first(rows), last(rows), want, oldestShown-1, oldestShown-uint64(want))
	}

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	for _, bad := range []string{"abc", "0", "-1", "18446744073709551616"} {
		if p := b.get("/ui/revocations?before=" + bad); p.status != http.StatusBadRequest || !strings.Contains(p.body, "before must be") {
			t.Errorf("?before=%s: status %d, want 400 naming before", bad, p.status)
		}
	}
}
