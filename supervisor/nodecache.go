package supervisor

import (
	"errors"
	"strings"
	"sync"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The nodes a termination marked, as the mark wrote them, kept in memory
// until the record's chunk that terminates them.
//
// Both the mark and the record read every member's node in their
// transaction and write it (the mark to stop it, the record to terminate
// it): on etcd each read is a range in the transaction, compared again at
// its commit. Most nodes do not change between the two (an agent that
// never confirms, a node with no session), so the record takes the value
// the mark wrote, moved forward by the reconciler's watch of the tree
// (every later write of a kept node replaces its value), and asks the
// store to check it at the commit instead of reading it (store.Expect: on
// etcd's first attempt a comparison of the value inside the commit, no
// range). A value that is stale — a write not yet delivered by the watch,
// or one the watch missed — fails that comparison: the attempt is void,
// and the next one reads every node as before. So this is only a cache:
// it never decides what the record says, the store's value at the commit
// does.
//
// Where the watch delivered the kept value (most nodes: the mark's own
// write comes back through it), its revision is kept too, and the record
// asks the store to check the node's revision instead of its value
// (store.RevisionExpecter: on etcd a comparison of the mod revision, a few
// bytes, where the value's comparison carried the whole node in the commit
// request). The mark notes the nodes a chunk is about to write before its
// transaction (await), so that the watch's events of those writes are
// kept even when they arrive before the commit returns; a value kept from
// the mark's commit, not seen by the watch, is checked by its value as
// before.
//
// The mark takes nodes from here too. It read every node of a chunk (a
// range each, then compared at its commit) though the same watch had
// delivered each node's latest write: on a backend that checks revisions
// at the commit (store.ChecksRevisions), every node the watch delivers is
// kept, with its revision (admit), and the mark's chunk checks the
// revision of a kept node at its commit instead of reading it; a node
// written since (an event not applied yet) fails the check, and the next
// attempt reads every node. The chunk takes the kept values before it
// notes the nodes it will write (await), which turns them back into
// placeholders for the chunk's own writes.
//
// It is used only on a backend that checks Expect at the commit (etcd;
// Badger reads locally, and a read costs it less than the comparison),
// only on an Update's first attempt, and only while the reconcile loop's
// watches run (reset, on their Scan, turns it on and drops what it kept).
// It is bounded (maxKeptNodes values, maxKeptBytes of them): a node the
// watch delivers when it is full takes the place of kept ones (any: a node
// not kept is read).
type nodeCache struct {
	mu       sync.Mutex
	watching bool
	used     bool                // a mark kept nodes here (the backend checks Expect at the commit)
	admit    bool                // keep every node the watch delivers (the backend checks revisions at the commit)
	nodes    map[string]keptNode // node id → its stored value
	bytes    int                 // keptCost of every entry of nodes
}

// keptNode is a kept node's stored value and, once the watch delivered
// it, the revision that wrote it (0: not known).
type keptNode struct {
	value []byte
	rev   uint64
}

// maxKeptNodes bounds the nodes kept (a few hundred bytes each).
const maxKeptNodes = 1 << 16

// maxKeptBytes bounds the memory the kept nodes take (keptCost): a node
// is a few hundred bytes, but one spawned with every label the tree
// allows is about 5 KB, and on etcd every node the watch delivers is
// kept, so a rogue's large nodes would otherwise hold 65,536 × 5 KB.
const maxKeptBytes = 32 << 20

// keptEntryBytes is what an entry costs besides its id and value (the
// map's slot, the value's slice header, the revision).
const keptEntryBytes = 64

// keptCost is the memory an entry of nodes is counted at.
func keptCost(id string, k keptNode) int { return len(id) + len(k.value) + keptEntryBytes }

// set puts k for id, counting its bytes (c.mu held).
func (c *nodeCache) set(id string, k keptNode) {
	if c.nodes == nil {
		c.nodes = make(map[string]keptNode)
	}
	if old, ok := c.nodes[id]; ok {
		c.bytes -= keptCost(id, old)
	}
	c.nodes[id] = k
	c.bytes += keptCost(id, k)
}

// drop removes id's entry (c.mu held).
func (c *nodeCache) drop(id string) {
	if old, ok := c.nodes[id]; ok {
		c.bytes -= keptCost(id, old)
		delete(c.nodes, id)
	}
}

// fits reports whether an entry k for id, new or replacing id's, keeps
// the cache within its bounds (c.mu held).
func (c *nodeCache) fits(id string, k keptNode) bool {
	n, b := len(c.nodes), c.bytes+keptCost(id, k)
	if old, ok := c.nodes[id]; ok {
		b -= keptCost(id, old)
	} else {
		n++
	}
	return n <= maxKeptNodes && b <= maxKeptBytes
}

// makeRoom drops kept entries other than id (any: a node not kept is
// read) until the cache is within its bounds, then id's if it still is
// not (c.mu held).
func (c *nodeCache) makeRoom(id string) {
	for other := range c.nodes {
		if len(c.nodes) <= maxKeptNodes && c.bytes <= maxKeptBytes {
			return
		}
		if other != id {
			c.drop(other)
		}
	}
	if len(c.nodes) > maxKeptNodes || c.bytes > maxKeptBytes {
		c.drop(id)
	}
}

// maxExpectBytes bounds the values one record chunk checks at its commit
// instead of reading (they travel in the commit request, beside its
// writes); the rest are read.
const maxExpectBytes = 256 << 10

var nodeKeyPrefix = tree.NodePrefix

// reset turns the cache on (the loop's watches are established) and drops
// what it kept; on a store that checks revisions at the commit it keeps
// every node its watch delivers from now on.
func (c *nodeCache) reset(st store.Store) {
	admit := st != nil && store.ChecksRevisions(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watching = true
	c.admit = admit
	c.used = c.used || admit
	c.nodes, c.bytes = nil, 0
}

// await notes, before a mark's chunk runs its transaction, the nodes it
// plans to write: the watch's events for them are kept from now on (a
// placeholder without a value until one arrives), so that the chunk's own
// writes are kept with their revision whichever of the event and the
// commit comes first. settle drops the placeholders left unfilled.
func (c *nodeCache) await(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watching || !c.used {
		return
	}
	if c.nodes == nil {
		c.nodes = make(map[string]keptNode)
	}
	for _, id := range ids {
		if !c.fits(id, keptNode{}) {
			return
		}
		// A value kept from before (admit) is the chunk's to check, taken
		// already (kept): from here on the entry waits for the chunk's
		// own write.
		c.set(id, keptNode{})
	}
}

// settle drops the placeholders await left for ids that no event filled
// (nodes the chunk did not write, or a chunk that did not commit).
func (c *nodeCache) settle(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if k, ok := c.nodes[id]; ok && k.value == nil {
			c.drop(id)
		}
	}
}

// keep keeps the values of nodes a mark's chunk wrote (after its commit).
// A node whose write the watch already delivered (await) keeps that
// value and its revision.
func (c *nodeCache) keep(nodes []*tree.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watching {
		return
	}
	if len(nodes) > 0 {
		c.used = true
	}
	for _, n := range nodes {
		if _, ok := c.nodes[n.NodeID]; !ok && len(c.nodes) >= maxKeptNodes {
			return
		}
		if k := c.nodes[n.NodeID]; k.rev != 0 {
			// The watch delivered a write of the node since await (the
			// chunk's own, most often): kept with its revision, and moved
			// on by the watch as before, so not encoded again here. (Were
			// it a write the chunk's commit followed, the chunk's own
			// event replaces it when it arrives; a record chunk that finds
			// it stale fails its check and reads.)
			continue
		}
		b, err := tree.MarshalNode(n)
		if err != nil {
			continue
		}
		if k := (keptNode{value: b}); c.fits(n.NodeID, k) {
			c.set(n.NodeID, k)
		} else {
			c.drop(n.NodeID) // read by the record
		}
	}
}

// forget drops the nodes a record's chunk terminated (after its commit).
func (c *nodeCache) forget(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.drop(id)
	}
}

// apply moves the kept nodes forward by the watch's events.
func (c *nodeCache) apply(batch []store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.nodes) == 0 && !c.admit {
		return
	}
	for _, ev := range batch {
		key := string(ev.Key)
		if !strings.HasPrefix(key, nodeKeyPrefix) {
			continue
		}
		id := key[len(nodeKeyPrefix):]
		if _, ok := c.nodes[id]; !ok && (!c.admit || ev.Type != store.EventPut) {
			continue
		}
		if ev.Type == store.EventPut {
			// Over the bounds, kept ones make room (any: they will be
			// read).
			c.set(id, keptNode{value: ev.Value, rev: ev.Revision})
			c.makeRoom(id)
		} else {
			c.drop(id)
		}
	}
}

func (c *nodeCache) value(id string) (keptNode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.nodes[id]
	return k, ok && k.value != nil
}

// kept returns the values kept for ids (those with one), for a mark's
// chunk to take before await turns them into placeholders.
func (c *nodeCache) kept(ids []string) map[string]keptNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.admit || len(c.nodes) == 0 {
		return nil
	}
	out := make(map[string]keptNode, len(ids))
	for _, id := range ids {
		if k, ok := c.nodes[id]; ok && k.value != nil && k.rev != 0 {
			out[id] = k
		}
	}
	return out
}

// nodesIn reads the nodes ids in tx, taking those kept here on trust
// (checked at the commit, store.Expect) when first says this is the
// Update's first attempt and the backend checks Expect at the commit.
func (c *nodeCache) nodesIn(tx store.ReadTxn, ids []string, first bool) (map[string]*tree.Node, error) {
	return nodesFrom(tx, ids, first, c.value)
}

// nodesFrom is nodesIn with the kept values given by value.
func nodesFrom(tx store.ReadTxn, ids []string, first bool, value func(string) (keptNode, bool)) (map[string]*tree.Node, error) {
	out := make(map[string]*tree.Node, len(ids))
	rest := ids
	if _, expects := tx.(store.Expecter); first && expects && value != nil {
		rest = nil
		budget := maxExpectBytes
		revs, byRev := tx.(store.RevisionExpecter)
		for _, id := range ids {
			k, ok := value(id)
			b := k.value
			byRev := byRev && k.rev != 0
			if !ok || (!byRev && len(b) > budget) {
				rest = append(rest, id)
				continue
			}
			var same bool
			var err error
			if byRev {
				same, err = revs.ExpectRevision(tree.NodeKey(id), k.rev)
			} else {
				same, err = store.Expect(tx, tree.NodeKey(id), b)
			}
			if errors.Is(err, store.ErrTooLarge) {
				rest = append(rest, id)
				budget = 0
				continue
			}
			if err != nil {
				return nil, err
			}
			n := &tree.Node{}
			if !same || tree.UnmarshalNode(b, n) != nil {
				rest = append(rest, id)
				continue
			}
			if !byRev {
				budget -= len(b)
			}
			out[id] = n
		}
	}
	if err := store.Prefetch(tx, store.KeysOf(rest, tree.NodeKey), nil); err != nil {
		return nil, err
	}
	for _, id := range rest {
		n, err := tree.GetNodeIn(tx, id)
		if err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, nil
}
