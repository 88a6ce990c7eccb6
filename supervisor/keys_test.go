package supervisor

import (
	"testing"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestKeyLayout pins the termination's, the records' and the proposals'
// storage keys: data written by an earlier version must still load, so a
// key may never change.
func TestKeyLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(terminationKey("t_1")), "terminations/t_1"},
		{TerminationPrefix, "terminations/"},
		{string(recordKey("r_1")), "records/r_1"},
		{string(recordPartKey("r_1", 2)), "records/r_1/part/000002"},
		{string(recordByTermKey("t_1")), "records-by-term/t_1"},
		{string(outboxKey("r_1")), "outbox/records/r_1"},
		{string(proposalKey("p_1")), "proposals/p_1"},
		{string(pendingPropPrefix("n_1")), "proposals-pending/n_1/"},
		{string(pendingPropKey("n_1", "p_1")), "proposals-pending/n_1/p_1"},
		{string(pendingTreePrefix("n_1")), "proposals-pending-tree/n_1/"},
		{string(pendingTreeKey("n_1", "p_1")), "proposals-pending-tree/n_1/p_1"},
		{string(propByNodePrefix("n_1")), "proposals-by-node/n_1/"},
		{string(propByNodeKey("n_1", "p_1")), "proposals-by-node/n_1/p_1"},
		{string(recordByTreePrefix("n_1")), "records-by-tree/n_1/"},
		{string(recordByTreeKey("n_1", "r_1")), "records-by-tree/n_1/r_1"},
		{string(recordByReqPrefix("agent")), "records-by-requester/agent/"},
		{string(recordByReqKey("agent", "r_1")), "records-by-requester/agent/r_1"},
		{string(recordByTreeReqPrefix("n_1", "agent")), "records-by-tree-requester/n_1/agent/"},
		{string(recordByTreeReqKey("n_1", "agent", "r_1")), "records-by-tree-requester/n_1/agent/r_1"},
		{indexedKey, "supervisor-meta/indexed/proposals-by-node,records-by-tree"},
		{pendingRulesIndexedKey, "supervisor-meta/indexed/proposals-pending-rules"},
		{indexedTreeReqKey, "supervisor-meta/indexed/records-by-tree-requester"},
		{tree.NodePrefix, "agents/node/"},
		{string(tree.NodeKey("n_1")), "agents/node/n_1"},
		{string(ledger.TermCallKey("t_1", "c_1")), "calls/term/t_1/c_1"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
