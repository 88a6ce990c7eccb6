package supervisor

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Requester is who requested the termination a record closes, as the
// records' index keeps it; the values are tether.v1.RecordRequester's.
type Requester int32

const (
	RequesterAny      Requester = 0
	RequesterOperator Requester = 1
	RequesterAgent    Requester = 2
	RequesterRollout  Requester = 3
)

// requesterNames name the requesters in the index's keys.
var requesterNames = map[Requester]string{RequesterOperator: "operator", RequesterAgent: "agent", RequesterRollout: "rollout"}

// requesterOf is the authority that requested t (Termination.Rank): an
// agent's stop (its Terminate, or the policy acting on its proposal or
// its rule) is an agent's, whoever approved it.
func requesterOf(t Termination) Requester {
	switch t.Rank() {
	case RankAgent:
		return RequesterAgent
	case RankRollout:
		return RequesterRollout
	default:
		return RequesterOperator
	}
}

// RecordFilter narrows a listing of records; the zero filter lists all.
type RecordFilter struct {
	// Tree: only the records of terminations that stopped nodes of the
	// tree whose root this is.
	Tree string
	// Requester: only the records of terminations this kind of principal
	// requested.
	Requester Requester
}

// indexRecord writes, inside tx, the record's entries in the indexes by
// tree, by requester and by tree and requester together, for the
// termination t that wrote it: one per tree of its subtree roots (a
// rollout's batch may stop several).
func indexRecord(tx store.Txn, recordID string, t Termination) error {
	req := requesterNames[requesterOf(t)]
	roots := t.Roots
	if len(roots) == 0 {
		roots = []string{t.NodeID}
	}
	var trees []string
	for _, r := range roots {
		root := r
		if r == t.NodeID && t.Tree != "" {
			root = t.Tree
		} else if n, err := tree.GetNodeIn(tx, r); err == nil {
			root = treeOf(n)
		} else if !errors.Is(err, tree.ErrNodeNotFound) {
			return err
		}
		if !slices.Contains(trees, root) {
			trees = append(trees, root)
		}
	}
	for _, root := range trees {
		if err := tx.Put(recordByTreeKey(root, recordID), []byte(req)); err != nil {
			return err
		}
		if err := tx.Put(recordByTreeReqKey(root, req, recordID), nil); err != nil {
			return err
		}
	}
	return tx.Put(recordByReqKey(req, recordID), nil)
}

// recordIDsOf lists, read in tx, up to pageSize record ids after
// pageToken that pass the filter, in id order, and the next page's token
// when there are more. A filtered listing reads its index only (the
// tree's, the requester's, or with both filters the tree's of that
// requester), never every record, nor the records of the tree another
// requester asked for: a page costs the entries it lists.
func recordIDsOf(tx store.ReadTxn, f RecordFilter, pageToken string, pageSize int) (ids []string, next string, err error) {
	var prefix, start []byte
	switch {
	case f.Tree != "" && f.Requester != RequesterAny:
		prefix = recordByTreeReqPrefix(f.Tree, requesterNames[f.Requester])
	case f.Tree != "":
		prefix = recordByTreePrefix(f.Tree)
	case f.Requester != RequesterAny:
		prefix = recordByReqPrefix(requesterNames[f.Requester])
	default:
		prefix = []byte(prefixRecord)
	}
	if pageToken != "" {
		start = append(append(slices.Clone(prefix), pageToken...), 0)
		if f.Tree == "" && f.Requester == RequesterAny {
			start = append(recordPartKey(pageToken, 1<<30), 0) // after the record's parts
		}
	}
	err = tx.Scan(prefix, start, func(k, v []byte) error {
		rest := string(k[len(prefix):])
		if strings.Contains(rest, "/") {
			return nil // a record's part
		}
		if len(ids) == pageSize {
			next = ids[len(ids)-1]
			return store.ErrStopScan
		}
		ids = append(ids, rest)
		return nil
	})
	return ids, next, err
}

// indexChunkEntries bounds the entries one transaction of IndexStored indexes.
const indexChunkEntries = 256

// IndexStored indexes what a version before the indexes of proposals by
// node and of records by tree, by requester and by tree and requester had
// stored, and the pending proposals of stop rules a version before left
// out of the pending index, each once: a chunk per transaction, each entry
// written as new writes write it (so a chunk done twice, after a kill -9,
// writes the same keys), then the marks that say they are complete. Each
// index added later has its own mark (indexedTreeReqKey,
// pendingRulesIndexedKey), so that a data directory whose older indexes
// are complete is indexed again for the new one. The control plane runs it
// at start, before it serves; with the marks written it reads three keys.
func (s *Supervisor) IndexStored(ctx context.Context) (indexed int, err error) {
	n, err := s.indexByNodeAndTree(ctx)
	indexed += n
	if err != nil {
		return indexed, err
	}
	n, err = s.indexPendingRules(ctx)
	return indexed + n, err
}

// marked reports whether the store holds the mark key.
func (s *Supervisor) marked(ctx context.Context, key string) (bool, error) {
	done := false
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		_, err := tx.Get([]byte(key))
		done = err == nil
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	})
	return done, err
}

// indexPendingRules puts each pending proposal of a stop rule, which a
// version before had left out, in its node's pending index, once.
func (s *Supervisor) indexPendingRules(ctx context.Context) (int, error) {
	if done, err := s.marked(ctx, pendingRulesIndexedKey); err != nil || done {
		return 0, err
	}
	n, err := s.indexAll(ctx, []byte(prefixProposal), func(tx store.Txn, k, v []byte) error {
		p := &StopProposal{}
		if err := decodeProposal(v, p); err != nil {
			return err
		}
		if p.Rule == nil || p.State != ProposalStatePending {
			return nil
		}
		return tx.Put(pendingPropKey(p.NodeID, p.ProposalID), []byte(pendingRuleMark))
	})
	if err != nil {
		return n, err
	}
	return n, s.Store.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte(pendingRulesIndexedKey), []byte("1")) })
}

// indexByNodeAndTree indexes the records by tree, by requester and by
// tree and requester, and the proposals by node, once each.
func (s *Supervisor) indexByNodeAndTree(ctx context.Context) (indexed int, err error) {
	proposalsDone, err := s.marked(ctx, indexedKey)
	if err != nil {
		return 0, err
	}
	recordsDone, err := s.marked(ctx, indexedTreeReqKey)
	if err != nil || (proposalsDone && recordsDone) {
		return 0, err
	}
	// The records, by their terminations' index (records-by-term/<t> → r).
	n, err := s.indexAll(ctx, []byte(prefixRecordByTerm), func(tx store.Txn, k, v []byte) error {
		termID, recordID := string(k[len(prefixRecordByTerm):]), string(v)
		var t Termination
		switch err := getTermination(tx, termID, &t); {
		case errors.Is(err, ErrTerminationNotFound):
			// Only the record says who asked, and for which roots.
			rec, err := getRecord(tx, recordID)
			if err != nil {
				return err
			}
			t = Termination{NodeID: rec.NodeID, Roots: rec.RootNodeIDs, RequestedBy: rec.RequestedBy, RolloutID: rec.RolloutID}
		case err != nil:
			return err
		}
		return indexRecord(tx, recordID, t)
	})
	indexed += n
	if err != nil {
		return indexed, err
	}
	if !proposalsDone {
		// The proposals, each under its node.
		n, err = s.indexAll(ctx, []byte(prefixProposal), func(tx store.Txn, k, v []byte) error {
			p := &StopProposal{}
			if err := decodeProposal(v, p); err != nil {
				return err
			}
			return tx.Put(propByNodeKey(p.NodeID, p.ProposalID), nil)
		})
		indexed += n
		if err != nil {
			return indexed, err
		}
	}
	return indexed, s.Store.Update(ctx, func(tx store.Txn) error {
		if err := tx.Put([]byte(indexedKey), []byte("1")); err != nil {
			return err
		}
		return tx.Put([]byte(indexedTreeReqKey), []byte("1"))
	})
}

// indexAll runs index on every entry under prefix, a chunk
// (indexChunkEntries) per transaction, and says how many it indexed.
func (s *Supervisor) indexAll(ctx context.Context, prefix []byte, index func(tx store.Txn, k, v []byte) error) (int, error) {
	indexed := 0
	var after []byte
	for {
		n, last, err := s.indexChunk(ctx, prefix, after, index)
		indexed += n
		if err != nil || last == nil {
			return indexed, err
		}
		after = last
	}
}

// indexChunk indexes, in one transaction, up to indexChunkEntries entries under
// prefix after the key `after` (nil: from the start), and returns how
// many and the last key (nil when the prefix is done).
func (s *Supervisor) indexChunk(ctx context.Context, prefix, after []byte, index func(tx store.Txn, k, v []byte) error) (int, []byte, error) {
	var n int
	var last []byte
	err := s.Store.Update(ctx, func(tx store.Txn) error {
		n, last = 0, nil
		var start []byte
		if after != nil {
			start = append(slices.Clone(after), 0)
		}
		type entry struct{ k, v []byte }
		var batch []entry
		more := false
		if err := tx.Scan(prefix, start, func(k, v []byte) error {
			if len(batch) == indexChunkEntries {
				more = true
				return store.ErrStopScan
			}
			batch = append(batch, entry{slices.Clone(k), slices.Clone(v)})
			return nil
		}); err != nil {
			return err
		}
		for _, e := range batch {
			if err := index(tx, e.k, e.v); err != nil {
				return err
			}
		}
		n = len(batch)
		if more {
			last = batch[len(batch)-1].k
		}
		return nil
	})
	return n, last, err
}
