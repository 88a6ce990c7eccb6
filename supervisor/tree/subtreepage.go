package tree

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
)

// SubtreePage lists a page of rootID's subtree: rootID and its
// descendants depth first, each node's children in id order (the child
// index's), after the node pageToken names (empty: from rootID), at most
// pageSize nodes matching selector, reading at most maxRead nodes of the
// walk, matching or not. next names the last node read when the walk
// stopped before the subtree's end (empty after its last node), so a
// large subtree is a number of bounded calls, each answer bounded, where
// Subtree reads and answers it whole (an agent may grow its own subtree to
// a hundred thousand nodes, each carrying every label allowed). The token
// is a node of the subtree; the page resumes from it by its ancestors (the
// path from rootID down to it), so nothing is kept between calls. Each
// page is its own snapshot: a node spawned between two pages is listed
// when the walk has not passed its place yet. A token that names no node
// of the subtree is refused ErrInvalidArgument, whether or not it names a
// node elsewhere. read is how many nodes it read.
func (t *Tree) SubtreePage(ctx context.Context, rootID string, selector map[string]string, pageToken string, pageSize, maxRead int) (out []*Node, next string, read int, err error) {
	if err := id.Check(id.Node, "root_node_id", rootID); err != nil {
		return nil, "", 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if pageToken != "" {
		if err := id.Check(id.Node, "page_token", pageToken); err != nil {
			return nil, "", 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	maxRead = max(maxRead, 1)
	if pageSize < 1 {
		pageSize = maxRead
	}
	err = t.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next, read = nil, "", 0
		root, err := getNode(tx, rootID)
		if err != nil {
			return err
		}
		read++
		w := &subtreeWalk{}
		last, walked := rootID, 0
		switch {
		case pageToken == "":
			walked++
			if MatchLabels(root.Labels, selector) {
				out = append(out, root)
			}
			w.stack = []*subtreeFrame{{parent: rootID}}
		case pageToken == rootID:
			w.stack = []*subtreeFrame{{parent: rootID}}
			last = pageToken
		default:
			at, err := getNode(tx, pageToken)
			if err != nil && !errors.Is(err, ErrNodeNotFound) {
				return err
			}
			if err != nil || !IsAncestor(at, rootID) {
				return fmt.Errorf("%w: page_token does not name a node of the subtree of %s", ErrInvalidArgument, rootID)
			}
			read++
			// Resume after the token: its own children first, then each
			// ancestor's children after the one on the path to it.
			path := append(slices.Clone(at.Ancestors[slices.Index(at.Ancestors, rootID):]), at.NodeID)
			for j := 0; j+1 < len(path); j++ {
				w.stack = append(w.stack, &subtreeFrame{parent: path[j], after: path[j+1]})
			}
			w.stack = append(w.stack, &subtreeFrame{parent: at.NodeID})
			last = pageToken
		}
		for {
			cid, parent, ok, err := w.next(tx, maxRead-walked+1)
			if err != nil || !ok {
				return err
			}
			if walked == maxRead || len(out) == pageSize {
				next = last
				return nil
			}
			n, err := getNode(tx, cid)
			if err != nil {
				return fmt.Errorf("supervisor: child index names %s: %w", cid, err)
			}
			read++
			walked++
			last = cid
			if MatchLabels(n.Labels, selector) {
				out = append(out, n)
			}
			if parent {
				w.stack = append(w.stack, &subtreeFrame{parent: cid})
			}
		}
	})
	return out, next, read, err
}

// subtreeWalk is SubtreePage's depth-first walk: a frame per node on the
// path from the root to the node last read, each reading its node's child
// index in batches.
type subtreeWalk struct {
	stack []*subtreeFrame
}

type subtreeFrame struct {
	parent string
	after  string // the last child taken (or the one the walk resumes after)
	ids    []string
	notes  []bool // whether ids[i] may have children
	pos    int
	done   bool // the child index was read to its end
}

// subtreeMinBatch is the fewest entries a frame reads of its child index
// at a time, whatever the frames below the root already hold.
const subtreeMinBatch = 64

// next is the walk's next node and whether it may have children, ok false
// at the subtree's end. A frame reads its child index in batches (and
// their nodes together, store.Prefetch) of what the page may still read,
// less what the frames hold unread, at least subtreeMinBatch: so a page
// reads at most about its bound plus subtreeMinBatch entries a level (a
// rogue's 32 levels of a thousand children each would otherwise have each
// frame read a thousand, 32,000 for a page of 1,000).
func (w *subtreeWalk) next(tx store.ReadTxn, remaining int) (nodeID string, mayHaveChildren, ok bool, err error) {
	held := 0
	for _, f := range w.stack {
		held += len(f.ids) - f.pos
	}
	batch := max(min(subtreeMinBatch, remaining), remaining-held)
	for len(w.stack) > 0 {
		f := w.stack[len(w.stack)-1]
		if f.pos < len(f.ids) {
			nodeID, mayHaveChildren = f.ids[f.pos], f.notes[f.pos]
			f.pos++
			f.after = nodeID
			return nodeID, mayHaveChildren, true, nil
		}
		if f.done {
			w.stack = w.stack[:len(w.stack)-1]
			continue
		}
		prefix := childPrefix(f.parent)
		var start []byte
		if f.after != "" {
			start = append(append(slices.Clone(prefix), f.after...), 0)
		}
		f.ids, f.notes, f.pos, f.done = f.ids[:0], f.notes[:0], 0, true
		if err := tx.Scan(prefix, start, func(k, v []byte) error {
			if len(f.ids) == batch {
				f.done = false
				return store.ErrStopScan
			}
			f.ids = append(f.ids, string(k[len(prefix):]))
			f.notes = append(f.notes, ChildMayHaveChildren(v))
			return nil
		}); err != nil {
			return "", false, false, err
		}
		if err := store.Prefetch(tx, store.KeysOf(f.ids, nodeKey), nil); err != nil {
			return "", false, false, err
		}
	}
	return "", false, false, nil
}
