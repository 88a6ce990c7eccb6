package supervisor

import (
	"context"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestARulesPendingProposalStoredBeforeItsIndexIsIndexedAtStart: a stop
// rule's pending proposal filed by a version that left it out of the
// pending index is put in it by IndexStored, once, at start; and an
// operator's rules pending at a node do not take the places of the
// agent's own proposals (MaxPendingProposals). (Fails if the node's
// pending list lacks the rule's proposal after IndexStored, or if the
// agent cannot propose its own stop beside it.)
func TestARulesPendingProposalStoredBeforeItsIndexIsIndexedAtStart(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 0)
	ctx := context.Background()
	n, err := s.Tree.RegisterRoot(ctx, "worker", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	var filed []*StopProposal
	for i := range MaxPendingProposals {
		if err := st.Update(ctx, func(tx store.Txn) error {
			p, _, err := s.FileRuleProposal(tx, n.NodeID, &StopRuleFiring{RuleID: "r_" + string(rune('a'+i)), Name: "rule", SetBy: "operator:o", NodeID: n.NodeID}, ModeDrain, ProposalPolicy{})
			filed = append(filed, p)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Propose(ctx, n.NodeID, "now", "mine", "agent:"+n.NodeID, ModeDrain, 0, ProposalPolicy{}); err != nil {
		t.Fatalf("the agent's own proposal beside %d of its operator's rules': %v", MaxPendingProposals, err)
	}
	// A version before: no pending entry for the rule's proposal, no mark.
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := tx.Delete(pendingPropKey(n.NodeID, filed[0].ProposalID)); err != nil {
			return err
		}
		return tx.Delete([]byte(pendingRulesIndexedKey))
	}); err != nil {
		t.Fatal(err)
	}
	pendingHas := func() bool {
		got, _, err := s.Proposals(ctx, ProposalStatePending, n.NodeID, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range got {
			if p.ProposalID == filed[0].ProposalID {
				return true
			}
		}
		return false
	}
	if pendingHas() {
		t.Fatal("the test's premise is gone: the unindexed proposal is listed")
	}
	if _, err := s.IndexStored(ctx); err != nil {
		t.Fatal(err)
	}
	if !pendingHas() {
		t.Error("after IndexStored the node's pending proposals lack its rule's pending proposal stored before the index")
	}
}
