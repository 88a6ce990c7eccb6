package agentsdk_test

import (
	"context"
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

// TestRogue40FARogueLineageCannotFillAToolServersVerifierCache: a tool
// server's verifier caches the tokens it verified, at most
// MaxCachedTokensPerHolder of one holder's, until its cache (CacheSize)
// is full, and then caches nothing more. A rogue with a grant holding a
// pattern spawns children (256 a request), delegates each four grants of
// 32 scopes of 128 bytes (a request each) and presents every token once:
// its lineage filled the cache, so that every honest agent's token, no
// longer cached, paid its signature check on every call for as long as the
// rogue kept presenting fresh ones; and each entry kept the token itself
// (up to 8 KiB) beside its claims (4 KiB of scopes): 10 KiB an entry,
// 640 MiB at the default 65,536 entries, held in the tool server's memory.
// The cache now keeps a token's digest, not the token, caches no claims
// past MaxCachedClaimBytes, and a full cache takes an honest lineage's
// token in place of the rogue's, whose lineage keeps at most an eighth of
// it (the control plane's own caches' rule).
func TestRogue40FARogueLineageCannotFillAToolServersVerifierCache(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := rogue34fRegister(t, admin, "rogue")
	honest := rogue34fRegister(t, admin, "honest")
	root, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fair, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: honest.Node.NodeId, Scopes: []string{"tool:search"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	const cacheSize = 64
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(srv.URL, srv.ToolServerToken(t, "tools"), agentsdk.WithHTTPClient(srv.HTTP)), StalenessBudget: time.Minute, CacheSize: cacheSize})
	if err != nil {
		t.Fatal(err)
	}
	rogue39iRun(t, v)

	// The rogue's children, a request.
	rc := srv.Clients(rogue.Credential)
	const children = cacheSize / agentsdk.MaxCachedTokensPerHolder
	batch := &tetherv1.SpawnBatchRequest{ParentNodeId: rogue.Node.NodeId}
	for i := range children {
		batch.Children = append(batch.Children, &tetherv1.SpawnBatchChild{Name: fmt.Sprint("filler", i)})
	}
	spawned, err := rc.Agent.SpawnBatch(ctx, connect.NewRequest(batch))
	if err != nil {
		t.Fatal(err)
	}
	delegate := func(child string, scopes []string) string {
		t.Helper()
		resp, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: root.Grant.GrantID, HolderNodeId: child, Scopes: scopes}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Token
	}

	// Four small tokens of each child fill the cache.
	for _, s := range spawned.Msg.Spawned {
		for i := range agentsdk.MaxCachedTokensPerHolder {
			if _, err := v.Verify(ctx, delegate(s.Node.NodeId, []string{fmt.Sprint("tool:search", i)})); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An honest agent's token, at its second call, is a hit.
	for range 2 {
		if _, err := v.Authorize(ctx, fair.Token, "tool:search"); err != nil {
			t.Fatal(err)
		}
	}
	if !agentsdk.CachedToken(v, fair.Token) {
		t.Errorf("the honest agent's token is not cached once the rogue's lineage filled the cache (%d entries): it pays its signature check on every call", cacheSize)
	}

	// Four large tokens of each child: 32 scopes of 128 bytes.
	var large []string
	for i := range capability.MaxScopes {
		large = append(large, "tool:"+strings.Repeat(fmt.Sprintf("%02d", i), (capability.MaxScopeBytes-5)/2)+"*")
	}
	for _, s := range spawned.Msg.Spawned {
		for range agentsdk.MaxCachedTokensPerHolder {
			if _, err := v.Verify(ctx, delegate(s.Node.NodeId, large)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const perEntry = 2 << 10
	held := agentsdk.CachedBytes(v)
	t.Logf("the cache holds %d bytes after the rogue's large tokens", held)
	if held > cacheSize*perEntry {
		t.Errorf("the verifier's cache of %d entries holds %d bytes of the rogue's tokens and claims, over %d (%d an entry)", cacheSize, held, cacheSize*perEntry, perEntry)
	}
}
