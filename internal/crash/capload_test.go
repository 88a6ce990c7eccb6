package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

const capClients = 2

// capLoad builds delegation chains (an operator's root grant to an agent,
// delegated to its child, delegated again to the grandchild) and revokes
// some of them, by an ancestor, by the issuer or by the security role.
type capLoad struct {
	h  *harness
	mu sync.Mutex
	// grants: every acknowledged grant. revoked: grants whose revocation
	// was acknowledged; maybeRevoked: revocations the kill cut off.
	grants       map[string]ackedGrant
	revoked      map[string]bool
	maybeRevoked map[string]bool
	introspected map[string]bool
	chains       int
}

type ackedGrant struct {
	id, holder, token string
	chain             []string // ancestors, root first
}

func newCapLoad(h *harness) *capLoad {
	return &capLoad{h: h, grants: map[string]ackedGrant{}, revoked: map[string]bool{}, maybeRevoked: map[string]bool{}, introspected: map[string]bool{}}
}

func (c *capLoad) grantCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.grants)
}

func (c *capLoad) revocationCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.revoked)
}

func (c *capLoad) run(wg *sync.WaitGroup, stop <-chan struct{}, seed uint64) {
	for i := range capClients {
		wg.Add(1)
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		go func() {
			defer wg.Done()
			for !stopped(stop) {
				before := c.h.unanswered.Load()
				c.chain(rng)
				if c.h.unanswered.Load() > before {
					backoff(stop) // the server is probably gone: do not spin
				}
			}
		}()
	}
}

// chain builds one delegation chain and maybe revokes part of it. A call
// without an answer ends the chain: what it would have built on is unknown.
func (c *capLoad) chain(rng *rand.Rand) {
	h := c.h
	c.mu.Lock()
	c.chains++
	n := c.chains
	c.mu.Unlock()
	root, ok := h.register(fmt.Sprintf("cap-root-%d", n))
	if !ok {
		return
	}
	child, ok := h.spawn(root, "cap-child")
	if !ok {
		return
	}
	grandchild, ok := h.spawn(child, "cap-grandchild")
	if !ok {
		return
	}
	var g0 *tetherv1.IssueRootResponse
	if ok, _ := h.write("issue root", func(ctx context.Context) (err error) {
		g0Resp, err := h.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
			HolderNodeId: root.id, Scopes: []string{"tool:*", "s3:read:*"}, Ttl: durationpb.New(24 * time.Hour)}))
		if err == nil {
			g0 = g0Resp.Msg
		}
		return err
	}); !ok {
		return
	}
	c.ack(ackedGrant{id: g0.Grant.GrantId, holder: root.id, token: g0.Token})
	delegate := func(from *agentRef, parent ackedGrant, to *agentRef, scopes ...string) (ackedGrant, bool) {
		var resp *tetherv1.DelegateResponse
		ok, _ := h.write("delegate", func(ctx context.Context) error {
			r, err := from.c.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: parent.id, HolderNodeId: to.id, Scopes: scopes}))
			if err == nil {
				resp = r.Msg
			}
			return err
		})
		if !ok {
			return ackedGrant{}, false
		}
		g := ackedGrant{id: resp.Grant.GrantId, holder: to.id, token: resp.Token, chain: append(slices.Clone(parent.chain), parent.id)}
		c.ack(g)
		return g, true
	}
	root0 := ackedGrant{id: g0.Grant.GrantId, holder: root.id}
	g1, ok := delegate(root, root0, child, "tool:shell", "s3:read:logs/*")
	if !ok {
		return
	}
	g2, ok := delegate(child, g1, grandchild, "tool:shell")
	if !ok {
		return
	}
	// Revoke (most chains): the grandparent revokes two levels down, the
	// issuer its own delegation, the grandparent the middle grant (and so
	// the grandchild's), or the security role the root.
	var by *testserver.Clients
	var target string
	switch rng.IntN(5) {
	case 0:
		by, target = root.c, g2.id
	case 1:
		by, target = child.c, g2.id
	case 2:
		by, target = root.c, g1.id
	case 3:
		by, target = h.security, root0.id
	default:
		return
	}
	answered, err := h.write("revoke", func(ctx context.Context) error {
		_, err := by.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: target}, Reason: "crash harness"}))
		return err
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case answered && err == nil:
		c.revoked[target] = true
	case !answered:
		c.maybeRevoked[target] = true
	}
}

func (c *capLoad) ack(g ackedGrant) {
	c.mu.Lock()
	c.grants[g.id] = g
	c.mu.Unlock()
}

// check: every acknowledged grant is present with its holder and chain;
// every acknowledged revocation holds, for the grant and all it derives;
// a grant nobody tried to revoke is still active; and the tokens of
// revoked grants no longer introspect as active.
func (c *capLoad) check(round int) {
	h := c.h
	h.t.Helper()
	stored := map[string]*tetherv1.Grant{}
	page := ""
	for {
		resp, err := h.admin.Capability.ListGrants(context.Background(), connect.NewRequest(&tetherv1.ListGrantsRequest{PageToken: page}))
		if err != nil {
			h.t.Fatalf("round %d: list grants: %v", round, err)
		}
		for _, g := range resp.Msg.Grants {
			stored[g.GrantId] = g
		}
		if page = resp.Msg.NextPageToken; page == "" {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, want := range c.grants {
		h.checkedGrants++
		got, ok := stored[id]
		switch {
		case !ok:
			h.t.Errorf("round %d: acknowledged grant %s is missing after the restart", round, id)
			continue
		case got.HolderNodeId != want.holder || !slices.Equal(got.Chain, want.chain):
			h.t.Errorf("round %d: grant %s is held by %s with chain %v, want %s with %v", round, id, got.HolderNodeId, got.Chain, want.holder, want.chain)
		}
		revokedBy, maybe := "", false
		for _, a := range append(slices.Clone(want.chain), id) {
			if c.revoked[a] {
				revokedBy = a
			}
			maybe = maybe || c.maybeRevoked[a]
		}
		switch {
		case revokedBy != "" && got.State != tetherv1.GrantState_GRANT_STATE_REVOKED:
			h.t.Errorf("round %d: grant %s is %s although the revocation of %s was acknowledged", round, id, got.State, revokedBy)
		case revokedBy == "" && !maybe && got.State != tetherv1.GrantState_GRANT_STATE_ACTIVE:
			h.t.Errorf("round %d: grant %s is %s; nobody revoked it", round, id, got.State)
		}
		if revokedBy != "" && !c.introspected[id] && want.token != "" {
			c.introspected[id] = true
			h.introspected++
			resp, err := h.admin.Capability.Introspect(context.Background(), connect.NewRequest(&tetherv1.IntrospectRequest{Token: want.token}))
			if err != nil {
				h.t.Fatalf("round %d: introspect: %v", round, err)
			}
			if resp.Msg.Active {
				h.t.Errorf("round %d: the token of grant %s is active after the acknowledged revocation of %s", round, id, revokedBy)
			}
		}
	}
}

// agentRef is a node the workload registered, with its credential.
type agentRef struct {
	id string
	c  *testserver.Clients
}

// write runs one non-lease write and reports whether it was acknowledged;
// a refusal is a finding (the workload sends only valid requests), a call
// without an answer is not.
func (h *harness) write(what string, f func(ctx context.Context) error) (bool, error) {
	answered, err := h.call(f)
	if answered && err != nil {
		h.t.Errorf("%s refused: %v", what, err)
	}
	return answered && err == nil, err
}

func (h *harness) register(name string) (*agentRef, bool) {
	var resp *tetherv1.RegisterRootResponse
	ok, _ := h.write("register "+name, func(ctx context.Context) error {
		r, err := h.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name}))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if !ok {
		return nil, false
	}
	h.nodes.add(resp.Node.NodeId, name)
	return &agentRef{id: resp.Node.NodeId, c: h.clients(resp.Credential)}, true
}

func (h *harness) spawn(parent *agentRef, name string) (*agentRef, bool) {
	var resp *tetherv1.SpawnResponse
	ok, _ := h.write("spawn "+name, func(ctx context.Context) error {
		r, err := parent.c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent.id, Name: name}))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if !ok {
		return nil, false
	}
	h.nodes.add(resp.Node.NodeId, name)
	return &agentRef{id: resp.Node.NodeId, c: h.clients(resp.Credential)}, true
}
