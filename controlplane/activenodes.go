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
// unseen, then drains the watch on the nodes under the lock, forgetting
// every node the changes name, and answers from memory only if nothing was
// unseen: so a termination or an exit confirmation that any reader could
// see before a call began — acknowledged or not — is applied before that
// call looks, and the very next call is refused. A lookup that missed
// reads the node at a generation, and its answer is remembered only if no
// node changed in between (a read that raced a write is not kept). On
// etcd a change committed by another replica reaches this one's watch
// after readers can see it, so there the node is read on every call
// (newActiveNodes returns nil).
type activeNodes struct {
	ctx    context.Context
	cancel context.CancelFunc

	watch func(ctx context.Context) (store.Watcher, func() bool, error)

	mu      sync.Mutex
	w       store.Watcher // nil: disabled (the store closed)
	unseen  func() bool   // a node change may be visible and not yet in w
	lineage map[string]string
	gen     uint64 // advanced whenever a node may have changed
}

// newActiveNodes watches st's nodes; nil (every call reads its node) when
// st is not a Badger store or cannot be watched.
func newActiveNodes(st store.Store) *activeNodes {
	b, ok := st.(*badgerstore.Badger)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &activeNodes{ctx: ctx, cancel: cancel, lineage: map[string]string{},
		watch: func(ctx context.Context) (store.Watcher, func() bool, error) {
			return b.WatchVisible(ctx, []byte(tree.NodePrefix))
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
	// unseen before the drain: if it was false, every change a reader
	// could have seen by now is in the buffer, and drained next.
	unseen := a.w != nil && a.unseen()
	a.drainLocked()
	if unseen {
		return "", false, a.gen
	}
	lineage, ok = a.lineage[nodeID]
	return lineage, ok, a.gen
}

// remember records that nodeID, read after lookup returned gen, may act,
// unless a node changed since.
func (a *activeNodes) remember(nodeID, lineage string, gen uint64) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drainLocked()
	if a.w == nil || a.gen != gen {
		return
	}
	if len(a.lineage) >= maxActiveNodes {
		clear(a.lineage)
	}
	a.lineage[nodeID] = lineage
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
			for _, ev := range batch {
				delete(a.lineage, strings.TrimPrefix(string(ev.Key), tree.NodePrefix))
			}
			a.gen++
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
	a.gen++
}

// close ends the watch.
func (a *activeNodes) close() {
	if a != nil {
		a.cancel()
	}
}
