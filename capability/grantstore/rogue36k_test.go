package grantstore

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// TestRogue36KARogueLineageCannotPushOutOthersVerifiedTokens: the cache of
// verified tokens bounds a holder to maxVerifiedPerHolder entries, but a
// rogue with many children (each a holder) presenting four tokens each
// filled the whole cache, and each further token of its lineage pushed out
// an entry chosen at random: other lineages' agents paid their
// verification again for as long as the rogue churned. A lineage (the
// root grant of the token's chain) that holds its share pushes out its own.
func TestRogue36KARogueLineageCannotPushOutOthersVerifiedTokens(t *testing.T) {
	c := newVerifiedTokens()
	now := time.Unix(1_800_000_000, 0)
	entry := func(holder, grant string, chain []string) verifiedToken {
		return verifiedToken{claims: capability.Claims{HolderNodeID: holder, GrantID: grant, Chain: chain, ExpiresAt: now.Add(time.Hour)}, verifiedAt: now}
	}
	remember := func(sum [sha256.Size]byte, e verifiedToken) {
		c.entries.Put(sum, e.claims.HolderNodeID, lineageOf(e.claims), e.claims.ExpiresAt, now, e)
	}
	var honest [][sha256.Size]byte
	for i := range 64 {
		sum := sha256.Sum256([]byte(fmt.Sprint("honest ", i)))
		honest = append(honest, sum)
		// Two honest lineages: a root's own grant and a child's under it.
		if i%2 == 0 {
			remember(sum, entry(fmt.Sprint("node_h", i), fmt.Sprint("grt_h", i), nil))
		} else {
			remember(sum, entry(fmt.Sprint("node_h", i), fmt.Sprint("grt_h", i), []string{"grt_honestroot"}))
		}
	}
	// The rogue's 3,000 children, four tokens each, presented twice over.
	for round := range 2 {
		for child := range 3000 {
			for k := range maxVerifiedPerHolder {
				sum := sha256.Sum256([]byte(fmt.Sprint("rogue ", round, child, k)))
				remember(sum, entry(fmt.Sprint("node_r", child), fmt.Sprint("grt_r", round, child, k), []string{"grt_rogueroot", fmt.Sprint("grt_rc", child)}))
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lost := 0
	for _, sum := range honest {
		if _, ok := c.entries.Get(sum); !ok {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("the rogue lineage's 24,000 tokens pushed out %d of the 64 other agents' verified tokens (cache %d entries)", lost, c.entries.Len())
	}
	if c.entries.Len() > maxVerified {
		t.Fatalf("the cache holds %d entries, past its %d", c.entries.Len(), maxVerified)
	}
}
