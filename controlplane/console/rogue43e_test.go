package console_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue43EFeedPageNamesWhoRevoked: the console's revocation feed
// (its page of older tombstones and its live stream) showed each
// tombstone's sequence, grant, time and reason: a rogue agent's
// revocation of its honest child's grant, with a reason written as the
// security team's, read on the page as an operator's. Each row now names
// who revoked the grant (the tombstone's revoked_by): the agent's node.
func TestRogue43EFeedPageNamesWhoRevoked(t *testing.T) {
	w := newWorld(t)
	const forged = "revoked by operator alice (security team): credential compromise"
	rogue := w.srv.Clients(w.creds["worker-1"])
	resp, err := rogue.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grants["helper"]}, Reason: forged}))
	if err != nil {
		t.Fatalf("worker-1's revocation of its child's grant: %v", err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get(fmt.Sprintf("/ui/revocations?before=%d", resp.Msg.Sequence+1))
	row := ""
	for _, r := range strings.Split(p.body, "<tr>") {
		if strings.Contains(r, w.grants["helper"]) {
			row, _, _ = strings.Cut(r, "</tr>")
		}
	}
	if row == "" {
		t.Fatalf("the feed page shows no row of the revoked grant %s:\n%s", w.grants["helper"], p.body)
	}
	if want := "agent:" + w.nodes["worker-1"].NodeId; !strings.Contains(row, want) {
		t.Fatalf("the feed page's row of the rogue's revocation names no revoker (want %s): %s", want, row)
	}
}
