package ledger

import (
	"bytes"
	"slices"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Batched reads: what OpenCallsIn and GetCallIn read for one node or one
// call, for many at once, fetched together (store.Prefetch) — on etcd a
// round trip for a batch, not one per node or per call.

// OpenCallsOf lists the open calls of each node (OpenCallsIn for each),
// by node id; a node with none has no entry.
func OpenCallsOf(tx store.ReadTxn, nodeIDs []string) (map[string][]*ToolCall, error) {
	if err := store.Prefetch(tx, nil, store.KeysOf(nodeIDs, openCallPrefix)); err != nil {
		return nil, err
	}
	ids, all, err := callIDsUnder(tx, nodeIDs, openCallPrefix)
	if err != nil {
		return nil, err
	}
	got, err := callsIn(tx, all)
	if err != nil {
		return nil, err
	}
	return byNode(ids, got), nil
}

// OpenAndEndedCallsOf lists, by node id, the open calls of each node of
// open (as OpenCallsOf) and the calls of each node of ended that ended on a
// termination's account and are in no record yet (EndedOnPrefix), the
// ranges of every node fetched together, then the calls of both together:
// the mark reads them for the nodes it reaches, the second only of those
// that may have such calls (tree.HoldsEndedCalls).
func OpenAndEndedCallsOf(tx store.ReadTxn, open, ended []string) (map[string][]*ToolCall, map[string][]*ToolCall, error) {
	if err := store.Prefetch(tx, nil, append(store.KeysOf(open, openCallPrefix), store.KeysOf(ended, endedOnPrefix)...)); err != nil {
		return nil, nil, err
	}
	openIDs, openAll, err := callIDsUnder(tx, open, openCallPrefix)
	if err != nil {
		return nil, nil, err
	}
	endedIDs, endedAll, err := callIDsUnder(tx, ended, endedOnPrefix)
	if err != nil {
		return nil, nil, err
	}
	got, err := callsIn(tx, append(openAll, endedAll...))
	if err != nil {
		return nil, nil, err
	}
	return byNode(openIDs, got), byNode(endedIDs, got), nil
}

// callIDsUnder lists, by node id, the ids of the calls under prefix(node)
// for each node of nodeIDs (a node once however often it is named), and
// all of them together.
func callIDsUnder(tx store.ReadTxn, nodeIDs []string, prefix func(string) []byte) (map[string][]string, []string, error) {
	ids := map[string][]string{}
	var all []string
	for _, node := range nodeIDs {
		if _, done := ids[node]; done {
			continue
		}
		calls, err := idsUnder(tx, prefix(node))
		if err != nil {
			return nil, nil, err
		}
		ids[node] = calls
		all = append(all, calls...)
	}
	return ids, all, nil
}

// byNode puts the calls read (got, by call id) in lists by node id; a
// node with none has no entry.
func byNode(ids map[string][]string, got map[string]*ToolCall) map[string][]*ToolCall {
	out := make(map[string][]*ToolCall, len(ids))
	for node, calls := range ids {
		for _, cid := range calls {
			out[node] = append(out[node], got[cid])
		}
	}
	return out
}

func callsIn(tx store.ReadTxn, callIDs []string) (map[string]*ToolCall, error) {
	if err := store.Prefetch(tx, store.KeysOf(callIDs, callKey), nil); err != nil {
		return nil, err
	}
	out := make(map[string]*ToolCall, len(callIDs))
	for _, cid := range callIDs {
		if _, ok := out[cid]; ok {
			continue
		}
		c, err := getCall(tx, cid)
		if err != nil {
			return nil, err
		}
		out[cid] = c
	}
	return out, nil
}

// KeyedObserver is an Observer that can say which keys ObserveCall reads
// when a call of a node ends, so that the ledger fetches them with the
// call (store.Prefetch): on etcd, ending a call is then one read and a
// commit, not reads in turn. ancestors are the node's, when the ledger
// knows them (a call begun through it), else nil: the keys read per
// ancestor (a stop rule's subtree totals) are then left to the
// Observer's own reads.
type KeyedObserver interface {
	ObservedKeys(nodeID string, ancestors []string) [][]byte
}

// prefetchFinish fetches what ending callID reads, when the node of the
// call is known here (a call begun, or ordered cancelled, through this
// ledger): the call, for an end its node (whether a stop covers it before
// its mark, accountToCoveringStop), and what the Observer reads for its
// node, together. It is a hint: the reads that follow are what the
// transaction reads, whatever it fetched.
func (l *Ledger) prefetchFinish(tx store.ReadTxn, callID string, end bool) error {
	n, known := l.nodes.lineageOf(callID)
	if !known {
		return nil // one key: nothing to fetch together
	}
	node := n.node
	keys := [][]byte{callKey(callID), openCallKey(node, callID), openCountKey(node)}
	if end {
		keys = append(keys, tree.NodeKey(node))
		keys = append(keys, tree.CoverKeys(node, n.ancestors)...)
	}
	if o, ok := l.Observer.(KeyedObserver); ok {
		for _, k := range o.ObservedKeys(node, n.ancestors) {
			if !slices.ContainsFunc(keys, func(have []byte) bool { return bytes.Equal(have, k) }) {
				keys = append(keys, k)
			}
		}
	}
	return store.Prefetch(tx, keys, nil)
}

// callNodes remembers the node of the open calls this process has seen
// (begun, or ordered cancelled), for prefetchFinish. It is bounded: when
// full it starts afresh (a call it forgot costs a read more, no more).
type callNodes struct {
	mu sync.Mutex
	m  map[string]callNode
}

// callNode is a call's node and, when known (a call begun here), the
// node's ancestors: what an end reads for the stop that may cover it.
type callNode struct {
	node      string
	ancestors []string
}

const maxCallNodes = 1 << 16

// remember is rememberIn of a call whose node's ancestors are not known
// here (a cancel order read): it keeps those remembered at the call's
// begin, which an end reads its Observer's keys by (KeyedObserver).
func (c *callNodes) remember(call *ToolCall) {
	if call == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.m[call.CallID]; ok && n.node == call.NodeID {
		return
	}
	if c.m == nil || len(c.m) >= maxCallNodes {
		c.m = make(map[string]callNode)
	}
	c.m[call.CallID] = callNode{node: call.NodeID}
}

// rememberIn is remember of a call whose node's ancestors are known.
func (c *callNodes) rememberIn(call *ToolCall, ancestors []string) {
	if call == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCallNodes {
		c.m = make(map[string]callNode)
	}
	c.m[call.CallID] = callNode{node: call.NodeID, ancestors: ancestors}
}

func (c *callNodes) forget(callID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, callID)
}

func (c *callNodes) of(callID string) (string, bool) {
	n, ok := c.lineageOf(callID)
	return n.node, ok
}

func (c *callNodes) lineageOf(callID string) (callNode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[callID]
	return n, ok
}

// ackDeadlines keeps the acknowledgement deadlines of the terminations
// whose calls were acknowledged here (Ledger.AckWindow): a termination's
// deadline never changes once set. Bounded like callNodes: a termination
// it forgot costs a read more.
type ackDeadlines struct {
	mu sync.Mutex
	m  map[string]time.Time
	// marking: the terminations last read here with no deadline yet (a
	// large subtree still being marked, or a drain), with when; while one
	// was read in the last markingFor, acknowledgements read their call
	// and its termination before their transaction (Ledger.CancelAck).
	marking map[string]time.Time
}

// markingFor is how long a termination read here with no deadline keeps
// acknowledgements on the read-first path after its last such read: a
// mark's chunks follow each other well within it, and a termination that
// got its deadline is dropped at the next read that finds it.
const markingFor = 5 * time.Second

const maxAckDeadlines = 1 << 12

func (d *ackDeadlines) keep(terminationID string, deadline time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil || len(d.m) >= maxAckDeadlines {
		d.m = make(map[string]time.Time)
	}
	d.m[terminationID] = deadline
}

func (d *ackDeadlines) of(terminationID string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	deadline, ok := d.m[terminationID]
	return deadline, ok
}

// noteMarking notes that terminationID was read at now with no deadline.
func (d *ackDeadlines) noteMarking(terminationID string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.marking == nil || len(d.marking) >= maxAckDeadlines {
		d.marking = make(map[string]time.Time)
	}
	d.marking[terminationID] = now
}

// unmark drops terminationID from the terminations noted without a
// deadline (it has one now, or no longer waits).
func (d *ackDeadlines) unmark(terminationID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.marking, terminationID)
}

// anyMarking reports whether a termination was read here with no deadline
// within markingFor before now, and forgets those read longer ago.
func (d *ackDeadlines) anyMarking(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, seen := range d.marking {
		if now.Sub(seen) < markingFor {
			return true
		}
		delete(d.marking, id)
	}
	return false
}

// idsUnder lists the ids of the keys under prefix p (a node's open calls,
// its calls ended on a termination's account): each key is p and an id.
func idsUnder(tx store.ReadTxn, p []byte) ([]string, error) {
	var ids []string
	err := tx.Scan(p, nil, func(k, _ []byte) error {
		ids = append(ids, string(k[len(p):]))
		return nil
	})
	return ids, err
}
