package console_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue36DARareSelectorReadsAThousandNodesACall: a rogue grows its own
// subtree to 2,630 nodes, none of them labelled role=retrieval (only the
// world's helper is). An operator's listing of the whole tree with that
// selector read every node of the tree in one call, for the price of one
// request, until it found a page of matches or the end: however large the
// rogue grew its subtree, one call read it all. A call now reads at most a
// thousand nodes and answers the matches among them with a continuation
// (next_page_token) when it stopped before the end, so a rare selector
// costs a request per thousand nodes read and each call is bounded; paged
// through, the listing finds the helper once. The console's filtered view
// reads its pages the same way and links the next one.
func TestRogue36DARareSelectorReadsAThousandNodesACall(t *testing.T) {
	w := newWorld(t)
	growRogue(t, w)
	ctx := context.Background()
	var found []string
	calls := 0
	for token := ""; calls == 0 || token != ""; calls++ {
		if calls > 10 {
			t.Fatal("the listing's pages do not end")
		}
		resp, err := w.admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: "role=retrieval", PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.Msg.Nodes {
			found = append(found, n.Name)
		}
		token = resp.Msg.NextPageToken
	}
	if len(found) != 1 || found[0] != "helper" {
		t.Fatalf("the pages found %v, want the helper once", found)
	}
	// 2,635 nodes, at most a thousand read a call: three calls at least.
	if calls < 3 {
		t.Fatalf("a rare selector over the 2,635 nodes of the tree was answered in %d call(s): a call read more than a thousand nodes", calls)
	}

	// The console's filtered view: the helper found, the page bounded.
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	p := b.get("/ui/tree?selector=role%3Dretrieval")
	if p.status != http.StatusOK {
		t.Fatalf("filtered: %d\n%s", p.status, p.body)
	}
	if n := strings.Count(p.body, `<tr class="s-running">`); n != 1 || !strings.Contains(p.body, `>helper</a>`) {
		t.Fatalf("the filtered view shows %d matches, want the helper:\n%s", n, p.body)
	}
}
