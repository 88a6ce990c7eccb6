package console_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue43KLeftToAnotherStopIsNotConfirmedOnTheRecordPage: a rogue
// agent drains its own child on a day's window; an operator then aborts
// the rogue's subtree, which takes the child over, and the rogue's stop
// finishes at once with a record listing the child superseded by the
// operator's. The console counted every node not unaccounted as
// confirmed: the rogue's record page read "1 confirmed, 0 unaccounted"
// and "Every agent confirmed its exit" (and the records list 1 confirmed)
// for a child nobody confirmed, whose abort was still waiting on its
// acknowledgements. The page now counts it apart and names the
// termination that accounts for it.
func TestRogue43KLeftToAnotherStopIsNotConfirmedOnTheRecordPage(t *testing.T) {
	w := newWorld(t)
	done, outerID := testserver.DrainLeftToAnotherStop(t, w.admin, w.srv.Clients(w.creds["worker-1"]), w.nodes["worker-1"].NodeId, w.nodes["helper"].NodeId)
	if got := w.node(t, "helper"); got.TerminationId != outerID || got.State == tetherv1.NodeState_NODE_STATE_TERMINATED {
		t.Fatalf("helper: %s under %s, want still stopping under the operator's %s", got.State, got.TerminationId, outerID)
	}

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get("/ui/records/" + done.RecordId)
	if p.status != 200 {
		t.Fatalf("record page: %d\n%s", p.status, p.body)
	}
	if strings.Contains(p.body, `id="all-accounted"`) || strings.Contains(p.body, "Every agent confirmed its exit") {
		t.Errorf("the record page says every agent confirmed its exit, for a child left to %s that nobody confirmed", outerID)
	}
	if strings.Contains(p.body, "(1 confirmed,") {
		t.Errorf("the record page counts the superseded child confirmed")
	}
	if !strings.Contains(p.body, `href="/ui/terminations/`+outerID+`"`) {
		t.Errorf("the record page does not link the termination %s that accounts for the child", outerID)
	}
	list := b.get("/ui/records?tree=" + w.nodes["helper"].NodeId)
	row := ""
	for _, r := range strings.Split(list.body, "<tr") {
		if strings.Contains(r, done.RecordId) {
			row = r
		}
	}
	if row == "" || strings.Contains(row, "<td>1</td>") || !strings.Contains(row, "left to other terminations") {
		t.Errorf("the records list's row of the rogue's record counts the child confirmed or does not say it was left to another: %s", row)
	}
}

// TestRogue43KACallThatRanOnAfterItsCancelNeedsAttention: the operator
// aborts the rogue with its http call in flight; the abort orders the
// call's cancel, and the rogue's tool server, instead of acknowledging it,
// lets the tool run on and then reports the call completed. The record
// resolves the call completed (with the time its cancel was ordered), and
// the console's record page listed it among the tool calls as
// "completed", nowhere under Needs attention: an abort whose tool went on
// acting read as one that stopped it. The page now lists such a call
// under Needs attention, with when its cancel was ordered and when it
// ended.
func TestRogue43KACallThatRanOnAfterItsCancelNeedsAttention(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	calls, err := w.admin.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.nodes["rogue"].NodeId}))
	if err != nil || len(calls.Msg.Calls) != 1 {
		t.Fatalf("the rogue's calls in flight: %v, %v; want its one http call", calls, err)
	}
	call := calls.Msg.Calls[0].CallId
	gate := w.srv.Clients(w.srv.ToolServerToken(t, "gate-http"))
	done := testserver.AbortWithACallRunOn(t, w.admin, gate, w.clk, w.nodes["rogue"].NodeId, "gate-http", call, 0)

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get("/ui/records/" + done.RecordId)
	attention, _, _ := strings.Cut(p.body, "<h2>Agents")
	if !strings.Contains(attention, `id="ran-on-calls"`) || !strings.Contains(attention, call) {
		t.Fatalf("the record page's Needs attention does not list call %s, completed after its cancel was ordered:\n%s", call, attention)
	}
	list := b.get("/ui/records?tree=" + w.nodes["rogue"].NodeId)
	if !strings.Contains(list.body, "1 ran on after their cancel") {
		t.Errorf("the records list's row of the stop does not say a call ran on after its cancel:\n%s", list.body)
	}
}
