package controlplane_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fifth hostile pass over the capability tree and the
// termination core, against the real server.

// TestRogue35JNothingMintedWhileItsTreeIsStoppedOutlivesTheStop: a rogue
// root and its child race their own termination (an abort marked one node
// a chunk): they refresh their grants, delegate them down, and spawn
// grandchildren and arm them, in bursts, while the operator's stop is
// requested and marked (once the burst is under way). Each is refused in
// the words of a stop (failed_precondition, or unauthenticated once its
// credential is dead), nothing else. Afterwards no token any of them was
// answered with is active, no grant held in the tree is active, and the
// record lists each node of the tree exactly once, every acknowledged
// spawn among them.
func TestRogue35JNothingMintedWhileItsTreeIsStoppedOutlivesTheStop(t *testing.T) {
	const (
		workers = 4
		rounds  = 12
	)
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.TerminationChunk = 1 })
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	child := spawn(t, rc, rogue.Node.NodeId, "child")
	cc := srv.Clients(child.Credential)
	gRogue := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	gChild := delegate(t, rc, gRogue, child.Node.NodeId, "tool:*")

	var (
		mu      sync.Mutex
		tokens  []string
		spawned []string
		wg      sync.WaitGroup
		started = make(chan struct{})
		once    sync.Once
	)
	codes := map[string]int{}
	note := func(err error) {
		mu.Lock()
		codes[connect.CodeOf(err).String()]++
		mu.Unlock()
	}
	keep := func(tok string) {
		mu.Lock()
		tokens = append(tokens, tok)
		mu.Unlock()
		once.Do(func() { close(started) })
	}
	start := make(chan struct{})
	ctx := context.Background()
	for w := range workers {
		wg.Go(func() {
			<-start
			for range rounds {
				switch w % 2 {
				case 0:
					// The rogue: a fresh token of its own, and one more
					// grant for its child.
					if r, err := rc.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: gRogue.grant.GrantId})); err == nil {
						keep(r.Msg.Token)
					} else {
						note(err)
					}
					if r, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gRogue.grant.GrantId, HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:shell"}})); err == nil {
						keep(r.Msg.Token)
					}
				case 1:
					// The child: a grandchild, armed from its own grant.
					r, err := cc.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: child.Node.NodeId, Name: "grandchild"}))
					if err != nil {
						note(err)
						continue
					}
					mu.Lock()
					spawned = append(spawned, r.Msg.Node.NodeId)
					mu.Unlock()
					if d, err := cc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gChild.grant.GrantId, HolderNodeId: r.Msg.Node.NodeId, Scopes: []string{"tool:shell"}})); err == nil {
						keep(d.Msg.Token)
					}
					if f, err := cc.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: gChild.grant.GrantId})); err == nil {
						keep(f.Msg.Token)
					}
				}
			}
		})
	}
	close(start)
	go func() {
		// A burst that answers nothing lets the stop go on, to fail below.
		wg.Wait()
		once.Do(func() { close(started) })
	}()
	<-started
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	wg.Wait()
	if len(tokens) == 0 {
		t.Fatal("the burst was answered no token: nothing raced the stop")
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	for i, tok := range tokens {
		if in := introspect(t, admin, tok); in.Active {
			t.Errorf("token %d of %d (grant %s), answered while its tree was being stopped, is active after the stop", i, len(tokens), in.Grant.GetGrantId())
		}
	}
	tree := append([]string{rogue.Node.NodeId, child.Node.NodeId}, spawned...)
	for _, node := range tree {
		for _, g := range allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: node}) {
			if g.State == tetherv1.GrantState_GRANT_STATE_ACTIVE {
				t.Errorf("grant %s held by %s is active after its tree's stop", g.GrantId, node)
			}
		}
	}
	outcomes := nodeOutcomes(record(t, admin, term.TerminationId))
	for _, node := range tree {
		switch o, ok := outcomes[node]; {
		case !ok:
			t.Errorf("node %s of the stopped tree is missing from the record", node)
		case o == -1:
			t.Errorf("node %s is listed twice", node)
		}
	}
	if len(outcomes) != len(tree) {
		t.Errorf("the record lists %d nodes; the tree has %d", len(outcomes), len(tree))
	}
	t.Logf("refusals by code: %v", codes)
	for code, n := range codes {
		if code != connect.CodeFailedPrecondition.String() && code != connect.CodeUnauthenticated.String() {
			t.Errorf("%d of the tree's requests were refused %s, not as a stop refuses them", n, code)
		}
	}
	t.Logf("%d tokens answered, %d grandchildren spawned, all accounted for", len(tokens), len(spawned))
}

// TestRogue35JGrantsDelegatedAcrossTheirRootsRevocationDieWithIt: a rogue
// and its child delegate down from the rogue's root grant to the child's
// children, and refresh what they hold, in bursts, while an operator
// revokes that root (once the burst is under way). Once the revocation is
// answered no token any of them was answered with is active, and every
// grant derived from the root reads revoked — those written in the
// window, after the revocation's tombstone and before its marker passed,
// included — and stays so once the marker has run.
func TestRogue35JGrantsDelegatedAcrossTheirRootsRevocationDieWithIt(t *testing.T) {
	const (
		workers = 4
		rounds  = 6
	)
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	child := spawn(t, rc, rogue.Node.NodeId, "child")
	cc := srv.Clients(child.Credential)
	var below []string
	for range workers * rounds {
		below = append(below, spawn(t, cc, child.Node.NodeId, "grandchild").Node.NodeId)
	}
	gRogue := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*")
	gChild := delegate(t, rc, gRogue, child.Node.NodeId, "tool:*")

	var (
		mu      sync.Mutex
		tokens  []string
		grants  = []string{gChild.grant.GrantId}
		wg      sync.WaitGroup
		started = make(chan struct{})
		once    sync.Once
	)
	keep := func(tok, grant string) {
		mu.Lock()
		tokens = append(tokens, tok)
		if grant != "" {
			grants = append(grants, grant)
		}
		mu.Unlock()
		once.Do(func() { close(started) })
	}
	start := make(chan struct{})
	ctx := context.Background()
	for w := range workers {
		wg.Go(func() {
			<-start
			for r := range rounds {
				from, by := gRogue.grant.GrantId, rc
				if w%2 == 1 {
					from, by = gChild.grant.GrantId, cc
				}
				if d, err := by.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: from, HolderNodeId: below[w*rounds+r], Scopes: []string{"tool:shell"}})); err == nil {
					keep(d.Msg.Token, d.Msg.Grant.GrantId)
				}
				if f, err := by.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: from})); err == nil {
					keep(f.Msg.Token, "")
				}
			}
		})
	}
	close(start)
	go func() {
		// A burst that answers nothing lets the stop go on, to fail below.
		wg.Wait()
		once.Do(func() { close(started) })
	}()
	<-started
	if _, err := revokeGrant(admin, gRogue.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(tokens) == 0 {
		t.Fatal("the burst was answered no token: nothing raced the revocation")
	}
	check := func(when string) {
		for i, tok := range tokens {
			if in := introspect(t, admin, tok); in.Active {
				t.Errorf("%s: token %d of %d (grant %s) is active after its root's revocation", when, i, len(tokens), in.Grant.GetGrantId())
			}
		}
		for _, id := range grants {
			if g := getGrant(t, admin, id); g.State != tetherv1.GrantState_GRANT_STATE_REVOKED {
				t.Errorf("%s: grant %s, derived from the revoked root, reads %s", when, id, g.State)
			}
		}
	}
	check("at once")
	testserver.WaitFor(t, 20*time.Second, "the marker to mark every derived grant", func() bool {
		for _, node := range append([]string{rogue.Node.NodeId, child.Node.NodeId}, below...) {
			for _, g := range allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: node}) {
				if g.State == tetherv1.GrantState_GRANT_STATE_ACTIVE {
					return false
				}
			}
		}
		return true
	})
	check("after the marker")
	t.Logf("%d tokens answered, %d grants derived", len(tokens), len(grants))
}
