package stoprule

import "math"

// The evaluator is one for the cluster, and a node's evaluation costs
// what the rules in effect at it cost: its own, and its ancestors' —
// with agents' rules near the budget on a chain of descendants, many
// budgets a node. Served in no order by tree, the marked nodes of one
// tree that spends (a rogue whose descendants keep reporting) decided
// when every other tree's rules were judged. The marked nodes are kept
// by tree instead and the trees served in turn, each charged what its
// evaluations cost (deficit round robin): a tree evaluates its marked
// nodes, in the order they were marked, while its turn's allowance lasts;
// one that overspent sits out the turns that pay for it. Another tree's
// rule waits at most one turn of each tree with marked nodes (a turn is
// TurnCost and the node that overran it), whatever one tree spends; a
// tree alone has the whole evaluator.
//
// Within a tree, the operators' rules come first: each marked node is
// queued twice, once for the operators' rules in effect at it and once for
// the agents', and a tree's turn takes the first queue before the second.
// A node's agents' rules are evaluated with its operators' rules, on the
// same snapshot, when they cost little in the worst case
// (cheapAgentRulesCost); otherwise after every marked node's operators'
// rules, in the tree's turns — so a rogue whose own rules cost the
// evaluator much, on many nodes, does not delay its operators' rules on
// its own tree behind them.

// TurnCost is what a tree may spend of the evaluator each turn, in CEL
// cost units (one rule's worst case); evaluationBaseCost is what each
// node's evaluation is charged besides its rules' cost: the snapshot it
// reads.
const (
	TurnCost           = CostBudget
	evaluationBaseCost = 256
	// cheapAgentRulesCost: agents' rules in effect at a node that cost at
	// most this together in the worst case are evaluated with the node's
	// operators' rules, in one read.
	cheapAgentRulesCost = TurnCost / 8
	// subtreeToolsBytesPerRead: an evaluation that reads the subtree's
	// counts by tool is charged evaluationBaseCost more for each of these
	// bytes of the records' parts by tool it decodes, as the reads they
	// are. A record holds at most 2·(MaxTools+1) names of up to 128
	// bytes, some 17 KiB; a node's 256 records filled with 64 names of
	// 128 bytes took a quarter of a second to decode and add up on the
	// loaded test machine (some 2.8 MB: about 690 reads, 18 turns).
	subtreeToolsBytesPerRead = 4096
	// totalsBytesInRead: the growth and call totals a node's read reads
	// (readNodeTools, whatever rule is judged) are charged at the same
	// rate past this many bytes, some ninety records: a node of few
	// records is charged its one read, and one whose 256 growth and 256
	// call records a rogue filled (a child in each shard) about 22 KB,
	// five reads more. Read freshly written they took 0.24 ms on the
	// loaded test machine, 2.8–6 ms while they held the versions of their
	// many writes, where a node of few records took 8 µs.
	totalsBytesInRead = 4096
	// openCallsPerRead: an evaluation of a rule on call time reads the
	// node's own open calls (each a call record of the ledger) and is
	// charged evaluationBaseCost more for each of these many of them.
	openCallsPerRead = 32
	// grantsPerRead: an evaluation of a rule on observed.revocations
	// reads every grant the node holds (up to grantstore's MaxPerNode
	// live ones and as many dead) and judges each one's chain, and is
	// charged evaluationBaseCost more for each of these many of them. A
	// node holding 250 grants took 3.0 ms an evaluation on the loaded
	// test machine where one holding none took 33 µs: some ninety reads.
	grantsPerRead = 4
)

// phase says which of a node's rules an evaluation takes.
type phase int

const (
	operatorsPhase phase = iota // the operators' rules (and cheap agents' ones)
	agentsPhase                 // the agents' rules
)

// fifo is a set of node ids in the order they were added.
type fifo struct {
	marked map[string]bool
	order  []string // may hold ids removed since; head indexes it
	head   int
}

func (q *fifo) push(id string) bool {
	if q.marked[id] {
		return false
	}
	if q.marked == nil {
		q.marked = map[string]bool{}
	}
	q.marked[id] = true
	q.order = append(q.order, id)
	return true
}

func (q *fifo) remove(id string) bool {
	if !q.marked[id] {
		return false
	}
	delete(q.marked, id)
	return true
}

func (q *fifo) len() int { return len(q.marked) }

// pop takes the oldest id, or "" when there is none.
func (q *fifo) pop() string {
	for q.head < len(q.order) {
		id := q.order[q.head]
		q.order[q.head] = ""
		q.head++
		if q.marked[id] {
			delete(q.marked, id)
			return id
		}
	}
	return ""
}

// compact forgets the ids already taken once they are most of the order.
func (q *fifo) compact() {
	switch {
	case len(q.marked) == 0:
		q.order, q.head = nil, 0
	case q.head > 64 && q.head*2 > len(q.order):
		q.order = append(q.order[:0:0], q.order[q.head:]...)
		q.head = 0
	}
}

// treeQueue is one tree's marked nodes, in the order they were marked:
// for their operators' rules, then for their agents'.
type treeQueue struct {
	root      string
	operators fifo
	agents    fifo
	deficit   int64 // what is left of the tree's turns; negative when it overspent
	inTurn    bool  // its turn began and was cut by the slice's end
	inRing    bool
}

func (q *treeQueue) len() int { return q.operators.len() + q.agents.len() }

// fairQueue holds the marked nodes by tree and serves the trees in turn.
type fairQueue struct {
	trees map[string]*treeQueue // by root node id
	ring  []*treeQueue          // trees with marked nodes, in turn order
	next  int                   // the ring's tree whose turn is next
	size  int                   // marked nodes, counted once per queue
}

func newFairQueue() *fairQueue { return &fairQueue{trees: map[string]*treeQueue{}} }

// rootOf is the root of a node's tree.
func rootOf(id string, ancestors []string) string {
	if len(ancestors) > 0 {
		return ancestors[0]
	}
	return id
}

// mark queues a node of root's tree; a node already marked keeps its place.
func (f *fairQueue) mark(root, id string) {
	q := f.trees[root]
	if q == nil {
		q = &treeQueue{root: root}
		f.trees[root] = q
	}
	if q.operators.push(id) {
		f.size++
	}
	if q.agents.push(id) {
		f.size++
	}
	if !q.inRing {
		q.inRing = true
		f.ring = append(f.ring, q)
	}
}

// unmark drops a node's marks (its tree keeps its place in the ring until
// its turn finds it empty). An idle tree's debt is kept until its root is
// unmarked (terminated): a tree's debt outlives its queue, not the tree.
func (f *fairQueue) unmark(root, id string) {
	q := f.trees[root]
	if q == nil {
		return
	}
	if q.operators.remove(id) {
		f.size--
	}
	if q.agents.remove(id) {
		f.size--
	}
	if id == root && !q.inRing {
		delete(f.trees, root)
	}
}

func (f *fairQueue) len() int { return f.size }

// debts lists the trees in debt (having overspent their turns), by root.
func (f *fairQueue) debts() map[string]int64 {
	out := map[string]int64{}
	for root, q := range f.trees {
		if q.deficit < 0 {
			out[root] = q.deficit
		}
	}
	return out
}

// owe charges debts, by root, to the trees queued: a fresh queue's trees
// start as far behind as they were (a tree with nothing queued, its root
// terminated or its nodes judged, owes nothing more).
func (f *fairQueue) owe(debts map[string]int64) {
	for root, d := range debts {
		if q := f.trees[root]; q != nil && d < 0 {
			q.deficit = min(q.deficit, d)
		}
	}
}

// serve evaluates up to limit marked nodes (those with rules to evaluate:
// eval reports a cost), the trees in turn and within a
// tree the operators' rules first: eval is called with each node taken and
// the phase, and returns what its evaluation cost, which is charged to the
// node's tree, and whether it took the node's agents' rules too (in the
// operators' phase: they cost little). It stops early when eval fails.
func (f *fairQueue) serve(limit int, eval func(id string, p phase) (cost int64, agentsToo bool, err error)) error {
	return f.serveUpTo(limit, math.MaxInt64, eval)
}

// serveUpTo is serve, stopping too once the evaluations it made cost
// spend together (the one that passed it included).
func (f *fairQueue) serveUpTo(limit int, spend int64, eval func(id string, p phase) (cost int64, agentsToo bool, err error)) error {
	var spent int64
	for limit > 0 && spent < spend && len(f.ring) > 0 {
		if f.next >= len(f.ring) {
			f.next = 0
		}
		q := f.ring[f.next]
		if !q.inTurn {
			q.deficit += TurnCost
			q.inTurn = true
		}
		for limit > 0 && spent < spend && q.deficit > 0 && q.len() > 0 {
			id, p := q.operators.pop(), operatorsPhase
			if id == "" {
				id, p = q.agents.pop(), agentsPhase
			}
			f.size--
			cost, agentsToo, err := eval(id, p)
			if cost > 0 {
				limit-- // a node with nothing to evaluate read nothing
			}
			q.deficit -= cost
			spent += cost
			if agentsToo && q.agents.remove(id) {
				f.size--
			}
			if err != nil {
				return err
			}
		}
		if (limit == 0 || spent >= spend) && q.deficit > 0 && q.len() > 0 {
			return nil // the slice ended within this tree's turn: it goes on next time
		}
		q.inTurn = false
		q.operators.compact()
		q.agents.compact()
		if q.len() == 0 {
			// Served: out of the ring, its allowance left behind (a tree
			// does not save turns while idle; a debt it keeps).
			q.inRing = false
			q.deficit = min(q.deficit, 0)
			if q.deficit == 0 {
				delete(f.trees, q.root)
			}
			f.ring = append(f.ring[:f.next], f.ring[f.next+1:]...)
			continue
		}
		f.next++
	}
	return nil
}
