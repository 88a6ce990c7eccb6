package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

var (
	proposalsTable = regexp.MustCompile(`(?s)<table class="list" id="proposals">.*?</table>`)
	approveButton  = regexp.MustCompile(`(?s)<button name="decision" value="approve"[^>]*>(.*?)</button>`)
)

// TestAnOperatorSeesTheWindowARoguesStopProposalWouldGrantIt: an agent's
// own stop proposal keeps the agent's windows whoever approves it. The
// rogue proposes its own drain with a day's window (the most a termination
// may have) and a reason that asks to be stopped at once; its node page
// showed the proposal's condition, reason and "drain", and an Approve
// button: an operator who approved it to stop the rogue started a drain
// during which the rogue's calls ran on for a day. The page now names the
// window approval grants (and who proposed it) in the proposal's row and
// on the button itself. (Fails if the page leaves the window out.)
func TestAnOperatorSeesTheWindowARoguesStopProposalWouldGrantIt(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	if _, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{
		Condition: "calls>=1", Reason: "misbehaving: stop me now",
		Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour),
	})); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_OPERATOR))
	p := b.get("/ui/nodes/" + rogueID)
	if p.status != http.StatusOK {
		t.Fatalf("node page: %d\n%s", p.status, p.body)
	}
	table := proposalsTable.FindString(p.body)
	if table == "" {
		t.Fatalf("no proposals table on the rogue's page:\n%s", p.body)
	}
	if !strings.Contains(table, "24h0m0s") {
		t.Errorf("the proposal's row does not name the day's drain window approval grants:\n%s", table)
	}
	if !strings.Contains(table, "agent:"+rogueID) {
		t.Errorf("the proposal's row does not say the agent itself proposed it:\n%s", table)
	}
	m := approveButton.FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no Approve button for an operator:\n%s", table)
	}
	if !strings.Contains(m[1], "24h0m0s") {
		t.Errorf("the Approve button reads %q: it does not say it starts a drain of 24h0m0s", m[1])
	}
}
