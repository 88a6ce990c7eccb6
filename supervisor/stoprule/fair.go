package stoprule

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

// TurnCost is what a tree may spend of the evaluator each turn, in CEL
// cost units (one rule's worst case); evaluationBaseCost is what each
// node's evaluation is charged besides its rules' cost: the snapshot it
// reads.
const (
	TurnCost           = CostBudget
	evaluationBaseCost = 256
)

// treeQueue is one tree's marked nodes, in the order they were marked.
type treeQueue struct {
	root    string
	marked  map[string]bool
	order   []string // may hold ids unmarked since; head indexes it
	head    int
	deficit int64 // what is left of the tree's turns; negative when it overspent
	inTurn  bool  // its turn began and was cut by the slice's end
	inRing  bool
}

// fairQueue holds the marked nodes by tree and serves the trees in turn.
type fairQueue struct {
	trees map[string]*treeQueue // by root node id
	ring  []*treeQueue          // trees with marked nodes, in turn order
	next  int                   // the ring's tree whose turn is next
	size  int                   // marked nodes
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
		q = &treeQueue{root: root, marked: map[string]bool{}}
		f.trees[root] = q
	}
	if q.marked[id] {
		return
	}
	q.marked[id] = true
	q.order = append(q.order, id)
	f.size++
	if !q.inRing {
		q.inRing = true
		f.ring = append(f.ring, q)
	}
}

// unmark drops a node's mark (its tree keeps its place in the ring until
// its turn finds it empty).
func (f *fairQueue) unmark(root, id string) {
	if q := f.trees[root]; q != nil && q.marked[id] {
		delete(q.marked, id)
		f.size--
	}
}

func (f *fairQueue) len() int { return f.size }

// pop takes the next marked node of q, or "" when it has none.
func (q *treeQueue) pop() string {
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
func (q *treeQueue) compact() {
	if q.head > 64 && q.head*2 > len(q.order) {
		q.order = append(q.order[:0:0], q.order[q.head:]...)
		q.head = 0
	}
}

// serve evaluates up to limit marked nodes, the trees in turn: eval is
// called with each node taken and returns what its evaluation cost, which
// is charged to the node's tree. It stops early when eval fails.
func (f *fairQueue) serve(limit int, eval func(id string) (int64, error)) error {
	for limit > 0 && len(f.ring) > 0 {
		if f.next >= len(f.ring) {
			f.next = 0
		}
		q := f.ring[f.next]
		if !q.inTurn {
			q.deficit += TurnCost
			q.inTurn = true
		}
		for limit > 0 && q.deficit > 0 && len(q.marked) > 0 {
			id := q.pop()
			f.size--
			limit--
			cost, err := eval(id)
			q.deficit -= cost
			if err != nil {
				return err
			}
		}
		if limit == 0 && q.deficit > 0 && len(q.marked) > 0 {
			return nil // the slice ended within this tree's turn: it goes on next time
		}
		q.inTurn = false
		q.compact()
		if len(q.marked) == 0 {
			// Served: out of the ring, its allowance left behind (a tree
			// does not save turns while idle; a debt it keeps).
			q.inRing = false
			q.order, q.head = nil, 0
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
