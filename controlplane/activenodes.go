package controlplane

import (
	"context"
	"strings"
	"sync"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// maxActiveNodes bounds the nodes activeNodes remembers; past it, it starts
// over (a miss costs one read of the node).
const maxActiveNodes = 1 << 17

// maxChangedNodes bounds the node changes activeNodes keeps the generation
// of, for remember: past it, it forgets them all, and a read that missed
// before is not remembered (its next call reads again). A read takes far
// less time than this many changes do.
const maxChangedNodes = 1 << 12

// activeNodes remembers the agents that may act — known, not terminated,
// exit not confirmed — and their lineage, so that an agent's unary call
// (a lease renew, first of all) is authenticated without reading its node
// from the store each time. Only that answer is remembered: a refusal is
// decided, and a contradiction recorded, by reading the node every time.
//
// It is correct only where every change of a node is known to this
// process before any reader can see it, so it is used on Badger alone:
// the store belongs to this process (Badger locks its directory), and its
// committer puts an Update's watch events into the watchers' buffers
// before it answers the Update, and says (WatchVisible's unseen) while a
// change is visible but its events not yet buffered. Each lookup reads
// unseen for its node's key (WatchVisibleKeys), then drains the watch on
// the nodes under the lock, forgetting every node the changes name, and
// answers from memory only if no change of its node was unseen: so a
// termination or an exit confirmation that any reader could see before a
// call began — acknowledged or not — is applied before that call looks,
// and the very next call is refused. Changes of other nodes in flight
// (the children a spawning swarm adds) do not make it miss. A lookup that
// missed reads the node at a generation, and its answer is remembered
// only if that node did not change in between (a read that raced a write
// of it is not kept). On
// etcd a change committed by another replica reaches this one's watch
// after readers can see it, so there the node is read on every call
// (newActiveNodes returns nil).
//
// A node that never had a session (tree.NeverSessioned) is weighed, at
// each of its requests, against its ancestors' claims of exit
// (tree.NoteAtWorkAfterClaims): what it answers depends on its ancestors
// too. It is remembered once a request found nothing there to note, and
// answered from memory only while none of its ancestors changed since it
// was read: lookup reads unseen for the ancestors' keys as for the node's
// own, and misses when the drain brought a change of one of them (a
// parent's claim first of all) — so the very next request after a claim
// is weighed again. Until the thirty-eighth pass such a node was never
// remembered, and each request of a spawning parent or a tool caller
// that never opened a session read its node and its ancestors.
type activeNodes struct {
	ctx    context.Context
	cancel context.CancelFunc

	watch func(ctx context.Context) (store.Watcher, func(key string) bool, error)

	mu      sync.Mutex
	w       store.Watcher         // nil: disabled (the store closed)
	unseen  func(key string) bool // a change of the node at key may be visible and not yet in w
	lineage map[string]string
	// unclaimed are the nodes that never had a session remembered, each
	// answered only while none of its ancestors changed since it was read
	// (their claims of exit are what its requests are weighed against).
	unclaimed map[string]unclaimedNode
	gen       uint64 // advanced with every batch of node changes drained
	// changed is, for each node a drained change named, the generation
	// that change brought; floor is the generation before which changed
	// is forgotten (it is cleared when it grows past maxChangedNodes): a
	// read made at gen is stale for a node with changed > gen, and for
	// every node when gen < floor.
	changed map[string]uint64
	floor   uint64
}

// newActiveNodes watches st's nodes; nil (every call reads its node) when
// st is not a Badger store or cannot be watched.
func newActiveNodes(st store.Store) *activeNodes {
	b, ok := st.(*badgerstore.Badger)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &activeNodes{ctx: ctx, cancel: cancel, lineage: map[string]string{}, unclaimed: map[string]unclaimedNode{}, changed: map[string]uint64{},
		watch: func(ctx context.Context) (store.Watcher, func(key string) bool, error) {
			return b.WatchVisibleKeys(ctx, []byte(tree.NodePrefix))
		}}
	w, unseen, err := a.watch(ctx)
	if err != nil {
		cancel()
		return nil
	}
	a.w, a.unseen = w, unseen
	return a
}

// lookup returns nodeID's lineage if the node is remembered as one that
// may act; and the generation to pass to remember after reading the node
// otherwise.
func (a *activeNodes) lookup(nodeID string) (lineage string, ok bool, gen uint64) {
	if a == nil {
		return "", false, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// unseen before the drain: if it was false, every change of the node
	// (and, for one that never had a session, of its ancestors: their
	// claims of exit first of all) a reader could have seen by now is in
	// the buffer, and drained next.
	unseen := a.w != nil && a.unseen(tree.NodePrefix+nodeID)
	if u, ok := a.unclaimed[nodeID]; ok && !unseen && a.w != nil {
		for _, key := range u.ancestorKeys {
			if a.unseen(key) {
				unseen = true
				break
			}
		}
	}
	a.drainLocked()
	if unseen {
		return "", false, a.gen
	}
	if lineage, ok = a.lineage[nodeID]; ok {
		return lineage, true, a.gen
	}
	u, ok := a.unclaimed[nodeID]
	if !ok {
		return "", false, a.gen
	}
	if u.gen < a.floor {
		delete(a.unclaimed, nodeID)
		return "", false, a.gen
	}
	for _, key := range u.ancestorKeys {
		if a.changed[strings.TrimPrefix(key, tree.NodePrefix)] > u.gen {
			delete(a.unclaimed, nodeID)
			return "", false, a.gen
		}
	}
	return u.lineage, true, a.gen
}

// unclaimedNode is a remembered node that never had a session: its
// lineage, its ancestors' keys and the generation it was read after.
type unclaimedNode struct {
	lineage      string
	ancestorKeys []string
	gen          uint64
}

// remember records that n, read after lookup returned gen, may act,
// unless that node changed since. A node that never had a session
// (tree.NeverSessioned) is remembered only once its requests were
// weighed against its ancestors' claims of exit with nothing left to
// note (tree.NoteAtWorkAfterClaims), and unless one of its ancestors
// changed since gen; it is answered from memory only while none of them
// changes after (lookup), so the very next request after an ancestor's
// claim is weighed again.
func (a *activeNodes) remember(n *tree.Node, gen uint64) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drainLocked()
	if a.w == nil || gen < a.floor || a.changed[n.NodeID] > gen {
		return
	}
	if len(a.lineage)+len(a.unclaimed) >= maxActiveNodes {
		clear(a.lineage)
		clear(a.unclaimed)
	}
	if !tree.NeverSessioned(n) {
		a.lineage[n.NodeID] = lineageOf(n)
		return
	}
	keys := make([]string, len(n.Ancestors))
	for i, id := range n.Ancestors {
		if a.changed[id] > gen {
			return
		}
		keys[i] = tree.NodePrefix + id
	}
	a.unclaimed[n.NodeID] = unclaimedNode{lineage: lineageOf(n), ancestorKeys: keys, gen: gen}
}

// drainLocked applies the node changes committed so far: it forgets every
// node they name. A watch that ended (it lagged) is re-established before
// everything is forgotten, so that no change falls between the two.
func (a *activeNodes) drainLocked() {
	if a.w == nil {
		return
	}
	for {
		select {
		case batch, open := <-a.w.Events():
			if !open {
				a.restartLocked()
				return
			}
			a.gen++
			if len(a.changed)+len(batch) > maxChangedNodes {
				clear(a.changed)
				a.floor = a.gen
			}
			for _, ev := range batch {
				id := strings.TrimPrefix(string(ev.Key), tree.NodePrefix)
				delete(a.lineage, id)
				delete(a.unclaimed, id)
				a.changed[id] = a.gen
			}
		default:
			return
		}
	}
}

func (a *activeNodes) restartLocked() {
	w, unseen, err := a.watch(a.ctx)
	if err != nil {
		w = nil // the store closed: nothing is remembered any more
	}
	a.w, a.unseen = w, unseen
	clear(a.lineage)
	clear(a.unclaimed)
	a.gen++
	// Every read made before is stale: changes may have been missed.
	clear(a.changed)
	a.floor = a.gen
}

// close ends the watch.
func (a *activeNodes) close() {
	if a != nil {
		a.cancel()
	}
}
