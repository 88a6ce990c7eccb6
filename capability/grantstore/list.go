package grantstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
)

// MaxPageSize bounds one page of ListGrants.
const MaxPageSize = 1000

// ListQuery selects grants; at most one of the filters is set.
type ListQuery struct {
	HolderNodeID string
	// DerivedFromGrantID: the grant and everything derived from it.
	DerivedFromGrantID string
	// SubtreeNodeID: grants held anywhere in the node's subtree.
	SubtreeNodeID string
	PageSize      int
	// PageToken is the last grant id of the previous page.
	PageToken string
	// Charge, when set, is told how many nodes and grants the page read
	// past its own grants: the nodes of a SubtreeNodeID listing and the
	// ids of every grant they hold (each page reads the whole subtree),
	// and, for any listing, the other grants of the page's chains, each
	// once (read to show each grant in its effective state). An error
	// refuses the listing with it. The server charges the caller's rate
	// budget.
	Charge func(read int) error
}

// List returns grants in grant-id order, in their effective state, one
// page at a time. Without a filter an operator lists every grant and an
// agent its own subtree's; an agent never sees grants held outside its
// subtree.
func (s *Service) List(ctx context.Context, caller Caller, q ListQuery) ([]capability.Grant, string, error) {
	filters := 0
	for _, f := range []string{q.HolderNodeID, q.DerivedFromGrantID, q.SubtreeNodeID} {
		if f != "" {
			filters++
		}
	}
	if filters > 1 {
		return nil, "", fmt.Errorf("%w: set at most one of holder_node_id, derived_from_grant_id and subtree_node_id", ErrInvalidArgument)
	}
	switch {
	case q.PageSize < 0:
		return nil, "", fmt.Errorf("%w: page_size must not be negative", ErrInvalidArgument)
	case q.PageSize == 0 || q.PageSize > MaxPageSize:
		q.PageSize = MaxPageSize
	}
	if q.PageToken != "" {
		if err := checkID(id.Grant, "page_token", q.PageToken); err != nil {
			return nil, "", err
		}
	}
	if node, isAgent := caller.agentNode(); isAgent && filters == 0 {
		q.SubtreeNodeID = node
	}
	now := s.cfg.Clock.Now()
	var (
		out  []capability.Grant
		next string
	)
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next = out[:0], ""
		ids, more, read, err := s.listIDs(tx, caller, q)
		if err != nil {
			return err
		}
		reads := newReader(tx)
		for _, grantID := range ids {
			g, err := reads.indexed(grantID)
			if err != nil {
				return err
			}
			out = append(out, effective(g, reads.grant, now))
		}
		if more && len(ids) > 0 {
			next = ids[len(ids)-1]
		}
		if err := reads.failed(); err != nil {
			return err
		}
		if q.Charge != nil {
			// The chains' other grants (the reader read each once): a
			// page of grants each with ancestors of its own read them
			// all for one request.
			if err := q.Charge(read + len(reads.seen) - len(ids)); err != nil {
				return err
			}
		}
		return nil
	})
	return out, next, err
}

// listIDs returns one page of ids after q.PageToken, whether more follow,
// and how many nodes and grant ids it read past the page's.
func (s *Service) listIDs(tx store.ReadTxn, caller Caller, q ListQuery) ([]string, bool, int, error) {
	switch {
	case q.HolderNodeID != "":
		if err := checkID(id.Node, "holder_node_id", q.HolderNodeID); err != nil {
			return nil, false, 0, err
		}
		if err := s.visible(tx, caller, q.HolderNodeID); err != nil {
			return nil, false, 0, err
		}
		ids, more, err := store.IDsAfter(tx, holderPrefix(q.HolderNodeID), q.PageToken, q.PageSize)
		return ids, more, 0, err
	case q.DerivedFromGrantID != "":
		if err := checkID(id.Grant, "derived_from_grant_id", q.DerivedFromGrantID); err != nil {
			return nil, false, 0, err
		}
		root, _, err := getGrant(tx, q.DerivedFromGrantID)
		if err != nil {
			return nil, false, 0, err
		}
		// Delegation only goes down the agent tree, so whoever may see the
		// grant may see everything derived from it.
		if err := s.visible(tx, caller, root.HolderNodeID); err != nil {
			if errors.Is(err, ErrNotVisible) {
				// Answered as a grant that does not exist (as Get does),
				// without its holder: an agent learns neither whether
				// another tree's grant exists nor who holds it.
				return nil, false, 0, fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, q.DerivedFromGrantID)
			}
			return nil, false, 0, err
		}
		ids, more, err := store.IDsAfter(tx, derivedPrefix(root.GrantID), q.PageToken, q.PageSize)
		if err != nil {
			return nil, false, 0, err
		}
		// The grant itself is part of its subtree, at its place in id order.
		if root.GrantID > q.PageToken && (!more || root.GrantID < ids[len(ids)-1]) {
			i, _ := slices.BinarySearch(ids, root.GrantID)
			ids = slices.Insert(ids, i, root.GrantID)
			if len(ids) > q.PageSize {
				ids, more = ids[:q.PageSize], true
			}
		}
		return ids, more, 0, nil
	case q.SubtreeNodeID != "":
		if err := checkID(id.Node, "subtree_node_id", q.SubtreeNodeID); err != nil {
			return nil, false, 0, err
		}
		if err := s.visible(tx, caller, q.SubtreeNodeID); err != nil {
			return nil, false, 0, err
		}
		nodes, err := s.cfg.Tree.SubtreeIn(tx, q.SubtreeNodeID)
		if err != nil {
			return nil, false, 0, err
		}
		nodeIDs := make([]string, len(nodes))
		for i, n := range nodes {
			nodeIDs[i] = n.NodeID
		}
		all, err := heldIn(tx, nodeIDs)
		if err != nil {
			return nil, false, 0, err
		}
		slices.Sort(all)
		start, _ := slices.BinarySearch(all, q.PageToken)
		if start < len(all) && all[start] == q.PageToken {
			start++
		}
		// Every node and every grant id the subtree holds was read for
		// this page: a rogue paging its child's thousands of grants one
		// at a time had them all read for a request each.
		read := len(nodes) + len(all) - min(len(all)-start, q.PageSize)
		all = all[start:]
		if len(all) > q.PageSize {
			return all[:q.PageSize], true, read, nil
		}
		return all, false, read, nil
	default:
		if _, isAgent := caller.agentNode(); isAgent {
			return nil, false, 0, fmt.Errorf("%w: agents list only their own subtree", ErrNotVisible)
		}
		ids, more, err := store.IDsAfter(tx, []byte(prefixGrant), q.PageToken, q.PageSize)
		return ids, more, 0, err
	}
}
