package supervisor

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// heldGrants is a grant module whose holders hold a fixed set of grants:
// RevokeHeldBy revokes them all (idempotent, as grantstore's is) and every
// listing reports them, in no particular order.
type heldGrants struct{ by map[string][]HeldGrant }

func (h *heldGrants) list(holders []string, outcome bool) []HeldGrant {
	var out []HeldGrant
	for i := len(holders) - 1; i >= 0; i-- {
		for _, g := range h.by[holders[i]] {
			if outcome {
				g.Outcome, g.RevokedBy = capability.OutcomeRevoked, "termination"
			}
			out = append(out, g)
		}
	}
	return out
}

func (h *heldGrants) RevokeHeldBy(_ context.Context, holders []string, _, _ string) ([]HeldGrant, error) {
	return h.list(holders, false), nil
}

func (h *heldGrants) HeldBy(_ context.Context, holders []string) ([]HeldGrant, error) {
	return h.list(holders, true), nil
}

func (h *heldGrants) Outcomes(_ context.Context, held []HeldGrant) ([]HeldGrant, error) {
	out := make([]HeldGrant, len(held))
	for i, g := range held {
		g.Outcome, g.RevokedBy = capability.OutcomeRevoked, "termination"
		out[i] = g
	}
	return out, nil
}

// A node may hold any number of grants (an agent delegates to its child a
// request each), and a chunk's revocation wrote every one its members held
// to the held index, and its record part listed them all, each in one
// transaction: past Badger's transaction limit (15% of the memtable, here
// 8 MiB) the chunk failed every time. Both now go in pages; the
// termination stops after every chunk's commit and a fresh supervisor (a
// restart) takes it on from what is stored, and the record lists every
// grant exactly once and every node once.
func TestARecordWritesManyGrantsInPagesExactlyOnce(t *testing.T) {
	ctx := context.Background()
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{MemTableSize: 8 << 20}, 10)
	_, all := buildTree(t, st, 30, 3)
	const perHolder = 6000
	held := &heldGrants{by: map[string][]HeldGrant{}}
	want := map[string]bool{}
	for _, holder := range []string{all[3], all[6], all[18]} { // nodes that note nothing: they may hold grants
		for i := range perHolder {
			g := HeldGrant{GrantID: fmt.Sprintf("grant-%s-%05d-%s", holder, i, strings.Repeat("x", 20)), NodeID: holder, Issuer: "agent:" + all[0]}
			held.by[holder] = append(held.by[holder], g)
			want[g.GrantID] = true
		}
	}
	s.Grants = held
	term, err := s.Terminate(ctx, TerminateRequest{NodeID: all[0], Mode: ModeAbort, Reason: "abort", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	s, term, records := reconcileRestartingAfterEachChunk(t, ctx, s, term, func(s *Supervisor) { s.Grants = held })
	rec := checkRecord(t, s, term, all)
	seen := map[string]int{}
	for _, p := range rec.Privileges {
		if p.Kind == "grant" {
			seen[p.PrivilegeID]++
			if p.Outcome != PrivilegeOutcomeRevoked {
				t.Fatalf("grant %s is %v in the record, want revoked", p.PrivilegeID, p.Outcome)
			}
		}
	}
	for k := range want {
		if seen[k] != 1 {
			t.Fatalf("grant %s is in the record %d times, want once", k, seen[k])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("the record lists %d grants, the members held %d", len(seen), len(want))
	}
	// 31 nodes in chunks of 10 and the calls with the header: 5 record
	// transactions without the grants; some 18,000 grants of ~200 bytes
	// in pages of at most 512 KiB take at least 5 more.
	if records < 5+5 {
		t.Errorf("the record took %d transactions, want at least 10 (its grants in pages)", records)
	}
}
