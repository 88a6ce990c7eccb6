package controlplane_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-third hostile pass on the capability tree.

// feedRevokers returns grant id → the revoked_by each tombstone of a
// caller's revocation feed carries, up to the feed's head at sequence, and
// whether the feed's tombstones carry a revoked_by at all. It reads the
// field by name so that it says what a feed without one shows.
func feedRevokers(t *testing.T, c *testserver.Clients, sequence uint64) (map[string]string, bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	field := (&tetherv1.Tombstone{}).ProtoReflect().Descriptor().Fields().ByName("revoked_by")
	seen := map[string]string{}
	for stream.Receive() {
		for _, ts := range stream.Msg().Tombstones {
			if field == nil {
				seen[ts.GrantId] = ""
				continue
			}
			seen[ts.GrantId] = ts.ProtoReflect().Get(field).String()
		}
		if stream.Msg().HeadSequence >= sequence {
			return seen, field != nil
		}
	}
	t.Fatalf("the feed ended: %v", stream.Err())
	return nil, false
}

// TestRogue43EARoguesRevocationDoesNotReadAsAnOperatorsOnTheFeed: the
// revocation feed (WatchRevocations, the console's revocation feed page)
// showed each tombstone's grant, times, holder and reason, and nothing of
// who revoked it. The reason is the revoker's own text: a rogue agent that
// revoked its honest child's grant (its right, in its own subtree) with a
// reason written as the security team's ("revoked by operator alice:
// credential compromise, do not reissue") had a tombstone the security
// team could not tell from one an operator wrote, and an honest child
// cut off in the operator's name. Each tombstone now carries the
// principal that revoked it (revoked_by, as the grant's reads): the
// rogue's names the rogue's node, the operator's the operator. An agent's
// feed shows it with the reason, for its own and its ancestors' grants
// only: the rogue's sibling reads neither for the child's grant.
func TestRogue43EARoguesRevocationDoesNotReadAsAnOperatorsOnTheFeed(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	const forged = "revoked by operator alice (security team): credential compromise, do not reissue"
	rogue, err := w.parent.c.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.gChild.grant.GrantId}, Reason: forged}))
	if err != nil {
		t.Fatalf("the rogue's revocation of its child's grant: %v", err)
	}
	operator, err := w.admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.gUnrelated.grant.GrantId}, Reason: "credential compromise, do not reissue"}))
	if err != nil {
		t.Fatalf("the operator's revocation: %v", err)
	}
	head := max(rogue.Msg.Sequence, operator.Msg.Sequence)

	byOperator, carried := feedRevokers(t, w.admin, head)
	named := 0
	for _, g := range []string{w.gChild.grant.GrantId, w.gUnrelated.grant.GrantId} {
		if byOperator[g] != "" {
			named++
		}
	}
	if !carried || named != 2 {
		t.Fatalf("the operator's feed names who revoked %d of the 2 tombstones (revoked_by on the feed: %v): the rogue's revocation with the reason %q reads as the operator's own", named, carried, forged)
	}
	if got, want := byOperator[w.gChild.grant.GrantId], "agent:"+w.parent.id; got != want {
		t.Errorf("the rogue's tombstone reads revoked by %q, want %q", got, want)
	}
	if got := byOperator[w.gUnrelated.grant.GrantId]; !strings.HasPrefix(got, "operator:") {
		t.Errorf("the operator's tombstone reads revoked by %q, want an operator", got)
	}
	for name, c := range map[string]*testserver.Clients{"the holder": w.child.c, "its descendant": w.descendant.c} {
		if got, _ := feedRevokers(t, c, rogue.Msg.Sequence); got[w.gChild.grant.GrantId] != "agent:"+w.parent.id {
			t.Errorf("%s's feed reads the grant revoked by %q, want agent:%s", name, got[w.gChild.grant.GrantId], w.parent.id)
		}
	}
	if got, _ := feedRevokers(t, w.sibling.c, rogue.Msg.Sequence); got[w.gChild.grant.GrantId] != "" {
		t.Errorf("the sibling's feed names %q as the revoker of its sibling's grant (it is shown neither the holder nor the reason)", got[w.gChild.grant.GrantId])
	}
}
