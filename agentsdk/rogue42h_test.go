package agentsdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue42HAToolServersVerifierDoesNotKeepARoguesRevocationReasons: a
// tool server's verifier follows the whole revocation feed and keeps every
// live tombstone until its drop time (a quarter of an hour and more). A
// rogue agent delegates grants to its child, a request each, and revokes
// them all in one request with a reason of capability.MaxReasonBytes
// (1 KiB): the verifier kept each tombstone with the rogue's reason, which
// it never reads (a revoked token is refused by its grant id alone; the
// TypeScript and Python verifiers keep no reason), five times the rest of
// the tombstone, in the memory of every tool server the control plane
// feeds. It now keeps a tombstone's grant id and times only, and still
// refuses the revoked tokens.
func TestRogue42HAToolServersVerifierDoesNotKeepARoguesRevocationReasons(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := rogue34fRegister(t, admin, "rogue")
	root, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(srv.URL, srv.ToolServerToken(t, "tools"), agentsdk.WithHTTPClient(srv.HTTP)), StalenessBudget: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rogue39iRun(t, v)

	rc := srv.Clients(rogue.Credential)
	child, err := rc.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "filler"}))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	tokens := make([]string, 0, n)
	for i := range n {
		resp, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: root.Grant.GrantID, HolderNodeId: child.Msg.Node.NodeId, Scopes: []string{fmt.Sprint("tool:search", i)}}))
		if err != nil {
			t.Fatalf("delegation %d: %v", i, err)
		}
		tokens = append(tokens, resp.Msg.Token)
	}
	reason := strings.Repeat("r", capability.MaxReasonBytes)
	res, err := rc.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: child.Msg.Node.NodeId}, Reason: reason}))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Msg.RevokedGrantIds); got != n {
		t.Fatalf("the rogue's revocation wrote %d tombstones, want %d", got, n)
	}
	testserver.WaitFor(t, time.Minute, "the verifier at the rogue's revocation", func() bool { return v.Head() >= res.Msg.Sequence })

	held, bytes := agentsdk.HeldTombstoneBytes(v)
	t.Logf("the verifier holds %d tombstones, %d bytes of their text", held, bytes)
	if held < n {
		t.Fatalf("the verifier holds %d tombstones, want the rogue's %d", held, n)
	}
	// A grant id is 30 bytes; 64 a tombstone is room for its ids, none for
	// the rogue's reasons.
	if limit := held * 64; bytes > limit {
		t.Errorf("the tool server's verifier holds %d bytes of text for %d tombstones, over %d: it keeps the rogue's %d-byte revocation reasons", bytes, held, limit, len(reason))
	}
	// It still refuses every revoked token.
	for i, token := range tokens {
		if _, err := v.Verify(ctx, token); !errors.Is(err, capability.ErrGrantRevoked) {
			t.Fatalf("the rogue's revoked token %d: %v, want revoked", i, err)
		}
	}
}
