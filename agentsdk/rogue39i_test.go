package agentsdk_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// rogue39iRun starts v's Run until the test ends and waits for its first
// feed message.
func rogue39iRun(t *testing.T, v *agentsdk.Verifier) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-v.Ready():
	case <-time.After(time.Minute):
		t.Fatal("the verifier never heard the feed")
	}
}

// TestRogue39IATreeScopedVerifierRefusesAnotherTreesToken: a verifier
// whose Conn holds an agent's credential follows only that agent's tree's
// revocations, yet it accepted any token the control plane signed. A rogue
// of another tree presented its token there, was revoked in its own tree,
// and was still served, since that verifier never heard of the revocation,
// until its token expired (five minutes by default). Tokens now name their
// tree (the root claim) and the feed the tree it follows (tree_root): the
// tree-scoped verifier refuses another tree's token, before its
// revocation and after, with ErrTreeNotFollowed; a verifier following the
// whole feed (a viewer's or tool server's token) is unchanged.
func TestRogue39IATreeScopedVerifierRefusesAnotherTreesToken(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	ours := rogue34fRegister(t, admin, "ours")
	rogue := rogue34fRegister(t, admin, "rogue")
	issue := func(node string) grantstore.Issued {
		t.Helper()
		g, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: node, Scopes: []string{"tool:*"}, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	own, canary, rogues := issue(ours.Node.NodeId), issue(ours.Node.NodeId), issue(rogue.Node.NodeId)

	scoped, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(srv.URL, ours.Credential, agentsdk.WithHTTPClient(srv.HTTP)), StalenessBudget: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP)), StalenessBudget: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rogue39iRun(t, scoped)
	rogue39iRun(t, whole)
	if got := scoped.Tree(); got != ours.Node.NodeId {
		t.Fatalf("the agent-scoped verifier follows tree %q, want %q", got, ours.Node.NodeId)
	}
	if got := whole.Tree(); got != "" {
		t.Fatalf("the admin's verifier follows tree %q, want the whole feed", got)
	}
	// Its own tree's token is served at both.
	for _, v := range []*agentsdk.Verifier{scoped, whole} {
		if _, err := v.Authorize(ctx, own.Token, "tool:search"); err != nil {
			t.Fatalf("our own token: %v", err)
		}
	}
	if _, err := whole.Authorize(ctx, rogues.Token, "tool:search"); err != nil {
		t.Fatalf("the rogue's live token at the whole feed's verifier: %v", err)
	}

	// The rogue is revoked in its own tree; then a revocation in ours, so
	// that the scoped verifier has heard the feed past the rogue's.
	if _, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: rogues.Grant.GrantID}, "rogue"); err != nil {
		t.Fatal(err)
	}
	res, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: canary.Grant.GrantID}, "canary")
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, time.Minute, "both verifiers past the revocations", func() bool {
		return scoped.Head() >= res.Sequence && whole.Head() >= res.Sequence
	})
	if _, err := scoped.Verify(ctx, canary.Token); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("our revoked canary at the scoped verifier: %v, want revoked", err)
	}
	_, err = scoped.Authorize(ctx, rogues.Token, "tool:search")
	if !errors.Is(err, agentsdk.ErrTreeNotFollowed) {
		t.Fatalf("the rogue's revoked token of another tree at the tree-scoped verifier: %v, want ErrTreeNotFollowed", err)
	}
	if msg := err.Error(); !strings.Contains(msg, ours.Node.NodeId) || !strings.Contains(msg, "another tree") || strings.Contains(msg, rogues.Token) {
		t.Fatalf("the refusal does not say why in the user's words, or quotes the token: %s", msg)
	}
	// The whole feed's verifier heard the revocation.
	if _, err := whole.Authorize(ctx, rogues.Token, "tool:search"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("the rogue's revoked token at the whole feed's verifier: %v, want revoked", err)
	}
	if _, err := scoped.Authorize(ctx, own.Token, "tool:search"); err != nil {
		t.Fatalf("our own live token after the revocations: %v", err)
	}
}
