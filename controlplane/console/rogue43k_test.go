package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

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
	ctx := context.Background()
	rogue := w.srv.Clients(w.creds["worker-1"])
	inner, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["helper"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(24 * time.Hour), CancelAckTimeout: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
		Reason: "routine cleanup",
	}))
	if err != nil {
		t.Fatalf("the rogue's drain of its child: %v", err)
	}
	// The child has no call in flight: its drain is over at once, and the
	// rogue's stop waits a day for the child's exit to be confirmed.
	w.waitTermination(t, inner.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	outer, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["worker-1"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatalf("the operator's abort: %v", err)
	}
	done := w.waitTermination(t, inner.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	outerID := outer.Msg.Termination.TerminationId
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
