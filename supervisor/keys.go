package supervisor

import "fmt"

// Store key layout of the supervisor. Keys are readable strings so that a
// person debugging a data directory can follow them.
const (
	prefixNode  = "agents/node/"  // agents/node/<node id> → tetherv1.Node
	prefixChild = "agents/child/" // agents/child/<parent id>/<child id> → ""
	// agents/children/<parent id> → the parent's number of children (uint64,
	// big-endian), so a spawn checks the limit without counting them; a
	// parent without it (spawned before it existed) is counted once.
	prefixChildCount = "agents/children/"
	prefixSession    = "agents/session/" // agents/session/<instance>/<node id>/<session id> → "" while open
)

func sessionKey(instance, node, session string) []byte {
	return []byte(prefixSession + instance + "/" + node + "/" + session)
}

func nodeKey(id string) []byte             { return []byte(prefixNode + id) }
func childPrefix(parent string) []byte     { return []byte(prefixChild + parent + "/") }
func childKey(parent, child string) []byte { return []byte(prefixChild + parent + "/" + child) }
func childCountKey(parent string) []byte   { return []byte(prefixChildCount + parent) }

// Tool-call ledger keys.
const (
	prefixCall     = "calls/call/"   // calls/call/<call id> → tetherv1.ToolCall
	prefixOpenCall = "calls/open/"   // calls/open/<node id>/<call id> → "" while in flight
	prefixCancel   = "calls/cancel/" // calls/cancel/<gate id>/<call id> → "" while a cancel order is unacknowledged
	prefixTermCall = "calls/term/"   // calls/term/<termination id>/<call id> → "" calls a termination must account for
)

func callKey(id string) []byte             { return []byte(prefixCall + id) }
func openCallPrefix(node string) []byte    { return []byte(prefixOpenCall + node + "/") }
func openCallKey(node, call string) []byte { return []byte(prefixOpenCall + node + "/" + call) }
func cancelPrefix(gate string) []byte      { return []byte(prefixCancel + gate + "/") }
func cancelKey(gate, call string) []byte   { return []byte(prefixCancel + gate + "/" + call) }
func termCallPrefix(term string) []byte    { return []byte(prefixTermCall + term + "/") }
func termCallKey(term, call string) []byte { return []byte(prefixTermCall + term + "/" + call) }

// Termination, record, privilege and proposal keys.
const (
	prefixTermination  = "terminations/"      // terminations/<id> → Termination (JSON)
	prefixRecord       = "records/"           // records/<id> → tetherv1.ReconciliationRecord header; records/<id>/part/<n> → entries
	prefixRecordByTerm = "records-by-term/"   // records-by-term/<termination id> → record id
	prefixOutbox       = "outbox/records/"    // outbox/records/<record id> → "" until the sink has it
	prefixPrivilege    = "privileges/priv/"   // privileges/priv/<id> → Privilege (JSON)
	prefixNodePriv     = "privileges/node/"   // privileges/node/<node id>/<id> → ""
	prefixProposal     = "proposals/"         // proposals/<id> → tetherv1.StopProposal
	prefixPendingProp  = "proposals-pending/" // proposals-pending/<node id>/<id> → "" while pending
)

func terminationKey(id string) []byte { return []byte(prefixTermination + id) }
func recordKey(id string) []byte      { return []byte(prefixRecord + id) }
func recordPartKey(id string, n int) []byte {
	return []byte(fmt.Sprintf("%s%s/part/%06d", prefixRecord, id, n))
}
func recordByTermKey(term string) []byte   { return []byte(prefixRecordByTerm + term) }
func outboxKey(record string) []byte       { return []byte(prefixOutbox + record) }
func privilegeKey(id string) []byte        { return []byte(prefixPrivilege + id) }
func nodePrivPrefix(node string) []byte    { return []byte(prefixNodePriv + node + "/") }
func nodePrivKey(node, priv string) []byte { return []byte(prefixNodePriv + node + "/" + priv) }
func proposalKey(id string) []byte         { return []byte(prefixProposal + id) }
func pendingPropPrefix(node string) []byte { return []byte(prefixPendingProp + node + "/") }
func pendingPropKey(node, id string) []byte {
	return []byte(prefixPendingProp + node + "/" + id)
}

// Rollout keys.
const prefixRollout = "rollouts/" // rollouts/<id> → Rollout (JSON)

func rolloutKey(id string) []byte { return []byte(prefixRollout + id) }

// keysOf maps ids to keys (for store.Prefetch).
func keysOf(ids []string, key func(string) []byte) [][]byte {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}
