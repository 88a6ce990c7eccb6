package ledger

// Tool-call ledger keys.
const (
	prefixCall        = "calls/call/"        // calls/call/<call id> → ToolCall
	prefixOpenCall    = "calls/open/"        // calls/open/<node id>/<call id> → "" while in flight
	prefixCancel      = "calls/cancel/"      // calls/cancel/<gate id>/<call id> → "" while a cancel order is unacknowledged
	prefixTermCall    = "calls/term/"        // calls/term/<termination id>/<call id> → "" calls a termination must account for
	prefixRefused     = "calls/refused/"     // calls/refused/<termination id>/<node id>/<call id> → "" the node's refused calls the termination lists
	prefixEndedOn     = "calls/endedon/"     // calls/endedon/<node id>/<call id> → termination id: a call that ended on that termination's account, until its record lists it
	prefixRefusedMore = "calls/refusedmore/" // calls/refusedmore/<termination id>/<node id> → count of the node's refused calls past those listed
	prefixOpenCount   = "calls/opencount/"   // calls/opencount/<node id> → how many calls/open/<node id>/ keys there are, a uvarint (openCount)
)

func callKey(id string) []byte             { return []byte(prefixCall + id) }
func openCallPrefix(node string) []byte    { return []byte(prefixOpenCall + node + "/") }
func openCallKey(node, call string) []byte { return []byte(prefixOpenCall + node + "/" + call) }
func openCountKey(node string) []byte      { return []byte(prefixOpenCount + node) }
func cancelKey(gate, call string) []byte   { return []byte(prefixCancel + gate + "/" + call) }
func cancelPrefix(gate string) []byte      { return []byte(prefixCancel + gate + "/") }
func termCallPrefix(term string) []byte    { return []byte(prefixTermCall + term + "/") }
func termCallKey(term, call string) []byte { return []byte(prefixTermCall + term + "/" + call) }
func refusedPrefix(term, node string) []byte {
	return []byte(prefixRefused + term + "/" + node + "/")
}
func refusedKey(term, node, call string) []byte {
	return []byte(prefixRefused + term + "/" + node + "/" + call)
}

func endedOnPrefix(node string) []byte    { return []byte(prefixEndedOn + node + "/") }
func endedOnKey(node, call string) []byte { return []byte(prefixEndedOn + node + "/" + call) }

func refusedMoreKey(term, node string) []byte {
	return []byte(prefixRefusedMore + term + "/" + node)
}

// Prefix prefixes every key of the ledger.
const Prefix = "calls/"

// TerminationPrefixes are the prefixes of the ledger's keys whose changes
// may move a termination, which the termination reconciler watches: a
// call (stamped with the termination that ordered or accounts for it), the
// index of the calls a termination accounts for, and of the calls it
// refused. The others are written only beside a call's own key, in its
// transaction (a call's open index and count, its cancel order, the note
// of its end by node), or are a count the record reads (refusedmore): an
// acknowledgement's five writes there reached the reconciler's watch and
// were dropped, one event each (docs/capacity.md, "Forty-seventh pass
// perf"). A new kind of key a termination must see changes is added here.
func TerminationPrefixes() [][]byte {
	return [][]byte{[]byte(prefixCall), []byte(prefixTermCall), []byte(prefixRefused)}
}

// The keys a termination reads and writes inside its own transactions (it
// marks calls, orders cancels and closes them in its record).

// CallKey is a call's key.
func CallKey(id string) []byte { return callKey(id) }

// OpenCallPrefix prefixes the node's calls in flight.
func OpenCallPrefix(node string) []byte { return openCallPrefix(node) }

// OpenCallKey marks a call of the node in flight.
func OpenCallKey(node, call string) []byte { return openCallKey(node, call) }

// OpenCountKey counts the node's calls in flight (CloseOpenIn keeps it).
func OpenCountKey(node string) []byte { return openCountKey(node) }

// CancelKey marks a cancel order the gate has not acknowledged.
func CancelKey(gate, call string) []byte { return cancelKey(gate, call) }

// TermCallPrefix prefixes the calls a termination accounts for.
func TermCallPrefix(term string) []byte { return termCallPrefix(term) }

// RefusedPrefix prefixes the node's refused calls the termination lists.
func RefusedPrefix(term, node string) []byte { return refusedPrefix(term, node) }

// TermCallKey marks a call the termination accounts for.
func TermCallKey(term, call string) []byte { return termCallKey(term, call) }

// EndedOnPrefix prefixes the node's calls that ended on a termination's
// account and are in no record yet (the mark moves those that ended after
// its request: OpenAndEndedCallsOf, MoveEndedIn). A node that may have
// some says so (tree.HoldsEndedCalls).
func EndedOnPrefix(node string) []byte { return endedOnPrefix(node) }

// EndedOnKey marks a call of the node that ended on a termination's
// account (its value names the termination).
func EndedOnKey(node, call string) []byte { return endedOnKey(node, call) }

// RefusedMoreKey holds the count of the node's refused calls the
// termination counted past those it lists.
func RefusedMoreKey(term, node string) []byte { return refusedMoreKey(term, node) }
