package tree

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
)

// Level is one page of one level of the tree (ListLevel).
type Level struct {
	Nodes []*Node
	// ChildCounts holds the number of children of each listed node and of
	// the parent, where the tree stores it (a node spawned before the
	// counts existed, with children, is missing: it may have some).
	ChildCounts map[string]uint64
	// Next is the token of the next page; empty on the last.
	Next string
}

// ListLevel lists a page of parentID's children (parentID empty: the
// roots), in id order after pageToken, at most pageSize, from the child
// index (the roots' index), with the nodes' child counts. A page reads the
// entries it lists, their nodes and their counts: never a subtree, so
// that its cost is bounded however many nodes lie below (an agent may grow
// its own subtree to a hundred thousand). read is how many nodes it read.
func (t *Tree) ListLevel(ctx context.Context, parentID, pageToken string, pageSize int) (lv Level, read int, err error) {
	if parentID != "" {
		if err := id.Check(id.Node, "root_node_id", parentID); err != nil {
			return Level{}, 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	if pageToken != "" {
		if err := id.Check(id.Node, "page_token", pageToken); err != nil {
			return Level{}, 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	err = t.Store.View(ctx, func(tx store.ReadTxn) error {
		lv, read = Level{ChildCounts: map[string]uint64{}}, 0
		prefix := []byte(prefixRoot)
		if parentID != "" {
			parent, err := getNode(tx, parentID)
			if err != nil {
				return err
			}
			read++
			if err := noteChildCount(tx, parent, lv.ChildCounts); err != nil {
				return err
			}
			prefix = childPrefix(parentID)
		}
		var start []byte
		if pageToken != "" {
			start = append(append(slices.Clone(prefix), pageToken...), 0)
		}
		var ids []string
		if err := tx.Scan(prefix, start, func(k, _ []byte) error {
			if len(ids) == pageSize {
				lv.Next = ids[len(ids)-1]
				return store.ErrStopScan
			}
			ids = append(ids, string(k[len(prefix):]))
			return nil
		}); err != nil {
			return err
		}
		keys := store.KeysOf(ids, nodeKey)
		keys = append(keys, store.KeysOf(ids, childCountKey)...)
		if err := store.Prefetch(tx, keys, nil); err != nil {
			return err
		}
		for _, cid := range ids {
			c, err := getNode(tx, cid)
			if err != nil {
				return fmt.Errorf("supervisor: tree index names %s: %w", cid, err)
			}
			read++
			if err := noteChildCount(tx, c, lv.ChildCounts); err != nil {
				return err
			}
			lv.Nodes = append(lv.Nodes, c)
		}
		return nil
	})
	return lv, read, err
}

// noteChildCount notes n's number of children in counts when the tree
// knows it without counting: its stored count, or none for a node that
// has never had a child (HoldsTracked without HoldsChildren).
func noteChildCount(tx store.ReadTxn, n *Node, counts map[string]uint64) error {
	v, err := tx.Get(childCountKey(n.NodeID))
	switch {
	case err == nil && len(v) == 8:
		counts[n.NodeID] = binary.BigEndian.Uint64(v)
	case err == nil:
		return fmt.Errorf("supervisor: corrupt child count of %d bytes for node %s", len(v), n.NodeID)
	case !errors.Is(err, store.ErrNotFound):
		return err
	case n.Holds&HoldsTracked != 0 && n.Holds&HoldsChildren == 0:
		counts[n.NodeID] = 0
	}
	return nil
}

// rootsChunk bounds the nodes one transaction of IndexRoots reads.
const rootsChunk = 256

// IndexRoots writes the roots' index (ListLevel) for the roots a version
// before it stored, once: a chunk of nodes per transaction (a chunk done
// twice, after a kill -9, writes the same keys), then the mark that says
// it is complete. The control plane runs it at start, before it serves;
// with the mark written it reads one key.
func (t *Tree) IndexRoots(ctx context.Context) (indexed int, err error) {
	done := false
	if err := t.Store.View(ctx, func(tx store.ReadTxn) error {
		_, err := tx.Get([]byte(rootsIndexedKey))
		done = err == nil
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}); err != nil || done {
		return 0, err
	}
	var after []byte
	for {
		var last []byte
		n := 0
		err := t.Store.Update(ctx, func(tx store.Txn) error {
			last, n = nil, 0
			var start []byte
			if after != nil {
				start = append(slices.Clone(after), 0)
			}
			var roots []string
			seen := 0
			if err := tx.Scan([]byte(prefixNode), start, func(k, v []byte) error {
				if seen == rootsChunk {
					return store.ErrStopScan
				}
				seen++
				last = slices.Clone(k)
				node := &Node{}
				if err := UnmarshalNode(v, node); err != nil {
					return fmt.Errorf("supervisor: decode %s: %w", k, err)
				}
				if node.ParentNodeID == "" {
					roots = append(roots, node.NodeID)
				}
				return nil
			}); err != nil {
				return err
			}
			if seen < rootsChunk {
				last = nil
			}
			for _, r := range roots {
				if err := tx.Put(rootKey(r), nil); err != nil {
					return err
				}
			}
			n = len(roots)
			return nil
		})
		indexed += n
		if err != nil {
			return indexed, err
		}
		if last == nil {
			break
		}
		after = last
	}
	return indexed, t.Store.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte(rootsIndexedKey), []byte("1")) })
}
