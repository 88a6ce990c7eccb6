package auth

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// TestRogue37BALineageOfManyChildrenCannotPushOthersTokensOutOfTheCache:
// the bearer-token cache bounded a principal's entries (four), not a
// lineage's: a rogue spawning children by the thousand (SpawnBatch, 256 a
// call) had each child's credential remembered as it was minted, and once
// the cache was full every new one made room by dropping entries at
// random — other lineages' among them. An honest agent whose entry was
// dropped paid a verification again, and worse: an uncached credential is
// paid for from its address's budget for requests without a valid
// credential before it is verified, so behind a NAT whose budget the rogue
// kept spent with forged tokens, the honest agent's calls were refused
// resource_exhausted. A full cache now takes a lineage's token past its
// share in place of its lineage's oldest, and makes room from the lineages
// past their share first.
func TestRogue37BALineageOfManyChildrenCannotPushOthersTokensOutOfTheCache(t *testing.T) {
	fx := newCacheFixture(t)
	now := fuzzT0.Add(time.Minute)
	clock := func() time.Time { return now }
	const procedure = "/tether.v1.AgentService/GetNode"
	lineages := map[string]string{} // node → lineage, as the tree would answer
	i := &Interceptor{
		Issuer: fx.issuer,
		Now:    clock,
		Policy: Policy{procedure: Rule{Agents: true}},
		Cache:  NewTokenCache(64),
		AgentActive: func(_ context.Context, node string) (string, error) {
			if l, ok := lineages[node]; ok {
				return l, nil
			}
			return "", fmt.Errorf("%w: the credential's node is unknown", ErrRevoked)
		},
		Limiter:   &RateLimiter{Rate: 1e6, Burst: 1e6, Now: clock},
		Anonymous: &RateLimiter{Rate: 1, Burst: 1, Now: clock},
	}
	const nat = "198.51.100.7:40000" // the rogue and the honest agents share it
	call := func(tok string) error {
		_, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + tok}}, nat)
		return err
	}

	// Sixteen honest agents, each the root of its own lineage, verified on
	// their first call.
	var honest []string
	for k := range 16 {
		node := fmt.Sprintf("n_honest%d", k)
		lineages[node] = node
		tok, _, err := fx.issuer.MintAgent(node, fuzzT0, 2*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := call(tok); err != nil {
			t.Fatalf("honest agent %d: %v", k, err)
		}
		honest = append(honest, tok)
	}
	// The rogue root, and the NAT's budget for requests without a valid
	// credential spent with a forged token.
	lineages["n_rogue"] = "n_rogue"
	rogue, _, err := fx.issuer.MintAgent("n_rogue", fuzzT0, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := call(rogue); err != nil {
		t.Fatal(err)
	}
	forged := rogue[:strings.LastIndexByte(rogue, '.')+1] + strings.Repeat("A", 86)
	if err := call(forged); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("forged token: %v, want unauthenticated", err)
	}

	// The rogue spawns 1,000 children; each credential is minted, and
	// remembered, in its lineage.
	children := make([]string, 1000)
	for k := range children {
		node := fmt.Sprintf("n_child%d", k)
		lineages[node] = "n_rogue"
		if children[k], _, err = i.MintAgent(node, "n_rogue", now, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// Its children call with credentials the cache dropped (verified
	// again, the rogue's own budget paying), and with the ones it kept.
	for k := range children {
		if err := call(children[k]); err != nil && connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("child %d: %v", k, err)
		}
	}

	before := i.Cache.Stats()
	refused := 0
	for k, tok := range honest {
		if err := call(tok); err != nil {
			refused++
			t.Logf("honest agent %d: %v", k, err)
		}
	}
	if st := i.Cache.Stats(); st.Misses != before.Misses || refused > 0 {
		t.Errorf("after a rogue lineage's 1,000 children: %d of 16 honest agents' credentials were pushed out of the cache, %d of their calls refused", st.Misses-before.Misses, refused)
	}
	if st := i.Cache.Stats(); st.Size > 64 {
		t.Errorf("cache holds %d, over its 64", st.Size)
	}
}
