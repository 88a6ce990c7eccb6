package supervisor

// Store key layout of the supervisor. Keys are readable strings so that a
// person debugging a data directory can follow them.
const (
	prefixNode  = "agents/node/"  // agents/node/<node id> → tetherv1.Node
	prefixChild = "agents/child/" // agents/child/<parent id>/<child id> → ""
)

func nodeKey(id string) []byte             { return []byte(prefixNode + id) }
func childPrefix(parent string) []byte     { return []byte(prefixChild + parent + "/") }
func childKey(parent, child string) []byte { return []byte(prefixChild + parent + "/" + child) }

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
