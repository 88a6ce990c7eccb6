package controlplane_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-first rogue pass, the server's capability tree: what a rogue
// agent can make the tree's revocations cost.

// TestRogue31HRevokingALargeSubtreeCostsWhatListingItDoes: a rogue revokes
// the grants held in its own 2,049-node subtree, again and again. Each
// revocation reads every node of the subtree and what each holds to find
// the grants it revokes (none, after the first: the answer is the feed's
// head), yet cost one request: the same subtree's grants listed cost three
// (a request per thousand nodes read), so revoking was the rogue's way to
// have the server read its whole subtree three times as often. It now
// costs a request per thousand nodes read, as the listing does.
func TestRogue31HRevokingALargeSubtreeCostsWhatListingItDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the 2,049-node tree; make test and CI run them.")
	}
	srv, root, refill := bigRogueTree(t)
	ctx := context.Background()
	rogue := srv.Clients(root.Credential)
	refill()
	revocations := 0
	var refusal error
	for refusal == nil && revocations <= bigBurst {
		resp, err := rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{
			Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: root.Node.NodeId}, Reason: "again",
		}))
		if err != nil {
			refusal = err
			break
		}
		if len(resp.Msg.RevokedGrantIds) != 0 {
			t.Fatalf("the rogue's subtree holds no grant, yet its revocation revoked %v", resp.Msg.RevokedGrantIds)
		}
		revocations++
	}
	if revocations != bigBurst/3 {
		t.Fatalf("the rogue revoked its 2,049-node subtree's grants %d times on a budget of %d requests, want %d (three requests each); refused: %v", revocations, bigBurst, bigBurst/3, refusal)
	}
	wantLimit(t, "the rogue past its budget", refusal, connect.CodeResourceExhausted, "rate limit", "lineage "+root.Node.NodeId)
}
