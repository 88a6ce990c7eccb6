package supervisor

import "fmt"

// Store key layout of the termination, its records and the stop proposals.
// Keys are readable strings so that a person debugging a data directory can
// follow them. (The agent tree, the ledger, the privileges and the rollouts
// keep theirs in their own packages.)
const (
	prefixTermination  = "terminations/"           // terminations/<id> → Termination (JSON)
	prefixRecord       = "records/"                // records/<id> → "parts head"; records/<id>/part/<n> → ReconciliationRecord bytes (storecodec)
	prefixRecordByTerm = "records-by-term/"        // records-by-term/<termination id> → record id
	prefixOutbox       = "outbox/records/"         // outbox/records/<record id> → its group (the termination's turn) until the sink has it
	prefixProposal     = "proposals/"              // proposals/<id> → StopProposal (storecodec)
	prefixPendingProp  = "proposals-pending/"      // proposals-pending/<node id>/<id> → "" while an agent's proposal is pending, pendingRuleMark while a stop rule's is
	prefixPendingTree  = "proposals-pending-tree/" // proposals-pending-tree/<root id>/<id> → "" while an agent's proposal is pending
	prefixPropByNode   = "proposals-by-node/"      // proposals-by-node/<node id>/<id> → "" (every proposal, pending or decided)
	prefixRecordByTree = "records-by-tree/"        // records-by-tree/<root id>/<record id> → requester ("operator", "agent", "rollout")
	prefixRecordByReq  = "records-by-requester/"   // records-by-requester/<requester>/<record id> → ""
	// records-by-tree-requester/<root id>/<requester>/<record id> → ""
	prefixRecordByTreeReq = "records-by-tree-requester/"
	// indexedKey marks the indexes of proposals by node and of records by
	// tree and by requester complete, indexedTreeReqKey the index of
	// records by tree and requester: each written once IndexStored has
	// indexed what a version before that index had stored.
	indexedKey        = "supervisor-meta/indexed/proposals-by-node,records-by-tree"
	indexedTreeReqKey = "supervisor-meta/indexed/records-by-tree-requester"
	// pendingRulesIndexedKey marks the pending index complete with the
	// stop rules' proposals, which a version before it left out.
	pendingRulesIndexedKey = "supervisor-meta/indexed/proposals-pending-rules"
	// pendingRuleMark is a stop rule's entry in a node's pending index: the
	// per-node bound of the agent's own proposals (MaxPendingProposals)
	// skips it.
	pendingRuleMark = "rule"
)

// TerminationPrefix is the prefix of every termination's key, for the
// reconcilers that watch terminations (a rollout's batches).
const TerminationPrefix = prefixTermination

func terminationKey(id string) []byte { return []byte(prefixTermination + id) }
func recordKey(id string) []byte      { return []byte(prefixRecord + id) }
func recordPartKey(id string, n int) []byte {
	return []byte(fmt.Sprintf("%s%s/part/%06d", prefixRecord, id, n))
}
func recordByTermKey(term string) []byte   { return []byte(prefixRecordByTerm + term) }
func outboxKey(record string) []byte       { return []byte(prefixOutbox + record) }
func proposalKey(id string) []byte         { return []byte(prefixProposal + id) }
func pendingPropPrefix(node string) []byte { return []byte(prefixPendingProp + node + "/") }
func pendingPropKey(node, id string) []byte {
	return []byte(prefixPendingProp + node + "/" + id)
}
func pendingTreePrefix(root string) []byte { return []byte(prefixPendingTree + root + "/") }
func pendingTreeKey(root, id string) []byte {
	return []byte(prefixPendingTree + root + "/" + id)
}
func propByNodePrefix(node string) []byte { return []byte(prefixPropByNode + node + "/") }
func propByNodeKey(node, id string) []byte {
	return []byte(prefixPropByNode + node + "/" + id)
}
func recordByTreePrefix(root string) []byte { return []byte(prefixRecordByTree + root + "/") }
func recordByTreeKey(root, id string) []byte {
	return []byte(prefixRecordByTree + root + "/" + id)
}
func recordByTreeReqPrefix(root, req string) []byte {
	return []byte(prefixRecordByTreeReq + root + "/" + req + "/")
}
func recordByTreeReqKey(root, req, id string) []byte {
	return []byte(prefixRecordByTreeReq + root + "/" + req + "/" + id)
}
func recordByReqPrefix(req string) []byte { return []byte(prefixRecordByReq + req + "/") }
func recordByReqKey(req, id string) []byte {
	return []byte(prefixRecordByReq + req + "/" + id)
}
