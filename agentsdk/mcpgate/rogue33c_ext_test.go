package mcpgate_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-third rogue pass against the MCP gateway (helper C).

// pingStatus POSTs a ping with token as the bearer to endpoint (no
// session: the SDK refuses it, the gateway having served the node) and
// returns the HTTP status.
func pingStatus(t *testing.T, endpoint, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A rogue cannot have its own request after its claim of exit served
// unseen by flooding the gateway's seen reports with its children. The
// gateway keeps a report's state for at most maxSeenNodes nodes (4096)
// and never forgets one whose report is owed; past the bound a node's
// request was served unreported for good. A rogue that spawned children,
// delegated them grants and had each send a request while their reports
// could not land (its lineage's budget spent, or the control plane out of
// reach) filled the bound with owed reports, claimed its exit and was
// answered unseen (and so was every other lineage's new node). Now a
// lineage's nodes take at most a quarter of the bound, and an HTTP request
// of a node the gateway has no room for is refused (503, CodeUnavailable),
// not served unreported. (Fails, by its guard, if the rogue's request is
// served and never reported, or if another lineage's node is refused.)
func TestRogue33CFloodOfChildrenCannotHaveTheRoguesRequestServedUnreported(t *testing.T) {
	defer mcpgate.SetMaxSeenNodesForTest(8)()
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gw, gclk, lost := gatewayLosingBegins(t, w)
	endpoint := serveGateway(t, gw)

	// The rogue's children, each with a grant delegated from its own.
	ctx := context.Background()
	claims, err := gw.Verifier().Identify(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	rogue := w.srv.Clients(credential)
	var children []string
	for i := range 8 {
		child, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: self, Name: fmt.Sprintf("flood-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		grant, err := rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{
			ParentGrantId: claims.GrantID, HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(30 * time.Minute),
		}))
		if err != nil {
			t.Fatal(err)
		}
		children = append(children, grant.Msg.Token)
	}
	claimAfterSessionEnd(t, w, self, credential)

	// The flood: each child's request, its report lost and owed.
	lost.down.Store(true)
	for _, c := range children {
		_ = pingStatus(t, endpoint, c)
	}
	// Another lineage's node is not refused for the rogue's flood.
	if got := pingStatus(t, endpoint, w.grant.Token); got == http.StatusServiceUnavailable {
		t.Fatalf("another lineage's ping during the rogue's flood: %d, refused", got)
	}
	// The rogue's own request after its claim.
	got := pingStatus(t, endpoint, token)
	t.Logf("the rogue's ping after its children's flood: HTTP %d", got)
	lost.down.Store(false)
	gclk.Advance(mcpgate.SeenReportRetry) // the owed reports are sent again, and land
	if got != http.StatusServiceUnavailable {
		testserver.WaitFor(t, guardWait, "the rogue's request served after its claim to be reported", func() bool {
			return len(nodeOf(t, w, self).Contradictions) > 0
		})
		return
	}
	// Refused, not served; served once there is room, and reported.
	gclk.Advance(mcpgate.SeenReportBurst * mcpgate.SeenReportInterval)
	testserver.WaitFor(t, guardWait, "room for the rogue once its children's reports landed", func() bool {
		return pingStatus(t, endpoint, token) != http.StatusServiceUnavailable
	})
	testserver.WaitFor(t, guardWait, "the rogue's request served after its claim to be reported", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}

// A rogue that claimed its exit cannot knock on the gateway unseen while
// the gateway's revocation feed is stale. Every request was refused 503
// before its bearer was read, and none was reported: the gateway could
// not tell revocations, but it could tell the holder (offline, by the
// token's signature), and a rogue knocking on through the feed's outage
// (its token expired meanwhile, no one renewing a claimed node's) left
// the record reading its exit confirmed. The refusal is now reported as
// the node seen before it is answered (owed, should the control plane be
// out of reach, until it lands). (Fails, by its guard, if the control
// plane never notes the rogue at work after its claim.)
func TestRogue33CRefusedForAStaleFeedAfterItsClaimIsLifeAfterIt(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gclk := clock.NewManual(w.clk.Now())
	gw := gatewayOnClock(t, w, gclk, nil)
	endpoint := serveGateway(t, gw)
	claimAfterSessionEnd(t, w, self, credential)

	// The feed stale on the gateway's clock (its budget a day).
	gclk.Advance(25 * time.Hour)
	if err := gw.Verifier().Fresh(); err == nil {
		t.Fatal("the gateway's feed is fresh a day on")
	}
	if got := pingStatus(t, endpoint, token); got != http.StatusServiceUnavailable {
		t.Fatalf("the rogue's ping with the feed stale: %d; want 503", got)
	}
	testserver.WaitFor(t, guardWait, "the rogue's refusal after its claim to be reported", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}
