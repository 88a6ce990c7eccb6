package grantstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
)

// bulkChunk bounds how many tombstones one bulk-revocation transaction
// writes, so that a revocation of thousands of independent grants stays
// within the store's transaction limits.
const bulkChunk = 500

// MaxAlreadyRevokedListed bounds the grants a revocation's answer lists as
// revoked already (RevokeResult.AlreadyRevoked): a sweep by issue time
// finds every dead grant still kept, and a rogue revoking its own tree's
// grants could otherwise grow an operator's answer past what it can be
// sent.
const MaxAlreadyRevokedListed = 1000

// Target names what Revoke revokes; exactly one field is set.
type Target struct {
	GrantID string
	// HolderNodeID: every grant held by this node.
	HolderNodeID string
	// SubtreeNodeID: every grant held anywhere in this node's subtree.
	SubtreeNodeID string
	// IssuedBefore: every grant created before this time.
	IssuedBefore time.Time
	// Charge, when set, is told how many nodes and grants a
	// HolderNodeID or SubtreeNodeID revocation read (the node or the
	// whole subtree, every grant each node holds and each other grant of
	// their chains, whatever it then revokes); an error refuses the
	// revocation with it, before anything is written. The server charges
	// the caller's rate budget, as for a listing (ListQuery.Charge).
	Charge func(read int) error
}

// RevokeResult says what a revocation wrote.
type RevokeResult struct {
	// GrantIDs are the grants this call wrote a tombstone for: the top
	// grants of the target, whose tombstones cover everything derived from
	// them. Empty when everything targeted was already revoked or expired.
	GrantIDs []string
	// Sequence is the feed sequence of the last tombstone written, or the
	// feed head when nothing needed writing: a follower that has seen it
	// rejects every targeted token.
	Sequence uint64
	// AlreadyRevoked are the grants the target named that were revoked
	// already (directly, by someone else, or through an ancestor): the
	// top ones, none of whose ancestors is listed, in id order, with
	// those a racing revocation wrote between this call's decision and
	// its write last. What the call covered without writing for it: an
	// operator revoking a rogue's subtree just after the rogue revoked its
	// own child's grants was told nothing of them. At most
	// MaxAlreadyRevokedListed; AlreadyRevokedNotListed counts the rest.
	AlreadyRevoked          []string
	AlreadyRevokedNotListed int
}

// Revoke revokes a grant — and with it every grant derived from it — or,
// in bulk, every grant held by a node, held in a node's subtree, or issued
// before a time. Each revoked grant gets one tombstone, written with the
// grant's new state in one transaction; descendants are marked later by
// RunMarker. Revocation is idempotent: a grant already revoked (directly
// or through an ancestor) is reported as success without a new tombstone.
//
// Authority is the grant's revoker set (capability.CanRevoke): a sibling,
// a descendant, an unrelated agent or the holder itself gets
// capability.ErrNotRevoker. A bulk revocation is refused whole, before
// anything is written, if the caller may not revoke one of its top grants.
func (s *Service) Revoke(ctx context.Context, caller Caller, target Target, reason string) (RevokeResult, error) {
	set := 0
	for _, isSet := range []bool{target.GrantID != "", target.HolderNodeID != "", target.SubtreeNodeID != "", !target.IssuedBefore.IsZero()} {
		if isSet {
			set++
		}
	}
	if set != 1 {
		return RevokeResult{}, fmt.Errorf("%w: exactly one target is required: grant_id, holder_node_id, subtree_node_id or issued_before", ErrInvalidArgument)
	}
	// Checked here, not only by the core for each grant it revokes, so that
	// a bad reason is refused the same way when nothing needs revoking.
	if len(reason) > capability.MaxReasonBytes || !utf8.ValidString(reason) {
		return RevokeResult{}, fmt.Errorf("%w: reason must be valid UTF-8 of at most %d bytes", ErrInvalidArgument, capability.MaxReasonBytes)
	}
	// An agent revokes only in its own subtree: a node outside it is
	// refused before its grants are read, alike whatever it holds and
	// whatever its state (the refusal names the node, nothing of its
	// grants), and a sweep by issue time, which reads every tree's grants,
	// is an operator's.
	agentNode, isAgent := caller.agentNode()
	switch {
	case target.GrantID != "":
		return s.revokeGrant(ctx, caller, target.GrantID, reason)
	case target.HolderNodeID != "":
		if err := checkID(id.Node, "holder_node_id", target.HolderNodeID); err != nil {
			return RevokeResult{}, err
		}
		return s.revokeMany(ctx, caller.Principal, caller.Roles, reason, target.Charge, func(tx store.ReadTxn) ([]string, int, error) {
			if err := s.revocableBy(tx, agentNode, isAgent, "holder_node_id", target.HolderNodeID); err != nil {
				return nil, 0, err
			}
			ids, err := heldIn(tx, []string{target.HolderNodeID})
			return ids, 1, err
		})
	case target.SubtreeNodeID != "":
		if err := checkID(id.Node, "subtree_node_id", target.SubtreeNodeID); err != nil {
			return RevokeResult{}, err
		}
		return s.revokeMany(ctx, caller.Principal, caller.Roles, reason, target.Charge, func(tx store.ReadTxn) ([]string, int, error) {
			if err := s.revocableBy(tx, agentNode, isAgent, "subtree_node_id", target.SubtreeNodeID); err != nil {
				return nil, 0, err
			}
			nodes, err := s.cfg.Tree.SubtreeIn(tx, target.SubtreeNodeID)
			if err != nil {
				return nil, 0, err
			}
			ids := make([]string, len(nodes))
			for i, n := range nodes {
				ids[i] = n.NodeID
			}
			held, err := heldIn(tx, ids)
			return held, len(nodes), err
		})
	default:
		if isAgent {
			return RevokeResult{}, fmt.Errorf("%w: issued_before revokes grants of every tree; an agent revokes by grant_id, holder_node_id or subtree_node_id in its own subtree", ErrOperatorOnly)
		}
		before := target.IssuedBefore
		return s.revokeMany(ctx, caller.Principal, caller.Roles, reason, nil, func(tx store.ReadTxn) ([]string, int, error) {
			ids, err := issuedBefore(tx, before)
			return ids, 0, err
		})
	}
}

// revocableBy checks, for an agent caller (isAgent), that nodeID is its
// own node or a descendant. A node that does not exist is the tree's
// not-found error for an operator; an agent is refused it as outside its
// subtree, in the words another tree's node gets, so the refusal never
// says which ids exist.
func (s *Service) revocableBy(tx store.ReadTxn, agentNode string, isAgent bool, field, nodeID string) error {
	n, err := s.cfg.Tree.GetNodeIn(tx, nodeID)
	if err != nil && !(isAgent && s.cfg.Tree.NodeNotFound(err)) {
		return err
	}
	if isAgent && (n == nil || nodeID != agentNode && !slices.Contains(n.Ancestors, agentNode)) {
		return fmt.Errorf("%w: agent %s may revoke only grants held in its own subtree, not by %s %s", ErrNotVisible, agentNode, field, nodeID)
	}
	return nil
}

// RevokeHeldBy implements the supervisor's GrantRevoker: it revokes every active
// grant held by the nodes, one tombstone per top grant, on behalf of by
// (e.g. "termination:<id>"). The termination was authorized when it was
// requested, so the revocation uses the security role's authority, which
// every revoker set holds. Idempotent. It returns every grant the nodes
// hold (active or not, without outcomes), in node order, as it read them:
// a termination keeps the list, since a stopped node is issued no more
// grants, and asks only their Outcomes later instead of listing them again.
func (s *Service) RevokeHeldBy(ctx context.Context, nodeIDs []string, by, reason string) ([]capability.HeldGrant, error) {
	var held []capability.HeldGrant
	_, err := s.revokeMany(ctx, by, []string{capability.RoleSecurity}, clipReason(reason), nil, func(tx store.ReadTxn) ([]string, int, error) {
		var err error
		held, err = heldPairs(tx, nodeIDs)
		ids := make([]string, len(held))
		for i, h := range held {
			ids[i] = h.GrantID
		}
		return ids, 0, err
	})
	return held, err
}

// HeldBy implements the supervisor's GrantRevoker: every grant held by the nodes
// with its outcome — capability.OutcomeRevoked (directly or through an
// ancestor), capability.OutcomeExpired, or "" while active.
func (s *Service) HeldBy(ctx context.Context, nodeIDs []string) ([]capability.HeldGrant, error) {
	return store.Read(ctx, s.cfg.Store, func(tx store.ReadTxn) ([]capability.HeldGrant, error) {
		held, err := heldPairs(tx, nodeIDs)
		if err != nil {
			return nil, err
		}
		return s.outcomesIn(tx, held)
	})
}

// Outcomes implements the supervisor's GrantRevoker: the grants (as
// RevokeHeldBy listed them) with their outcomes now, as HeldBy reports
// them, without reading the holders' indexes again.
func (s *Service) Outcomes(ctx context.Context, held []capability.HeldGrant) ([]capability.HeldGrant, error) {
	if len(held) == 0 {
		return nil, nil
	}
	return store.Read(ctx, s.cfg.Store, func(tx store.ReadTxn) ([]capability.HeldGrant, error) { return s.outcomesIn(tx, held) })
}

// outcomesIn is held with each grant's outcome, read in tx.
func (s *Service) outcomesIn(tx store.ReadTxn, held []capability.HeldGrant) ([]capability.HeldGrant, error) {
	now := s.cfg.Clock.Now()
	reads := newReader(tx)
	// One read per grant: on etcd, fetched together (store.Prefetch)
	// instead of a round trip each.
	all := make([]string, len(held))
	for i, h := range held {
		all[i] = h.GrantID
	}
	if err := store.Prefetch(tx, store.KeysOf(all, grantKey), nil); err != nil {
		return nil, err
	}
	out := make([]capability.HeldGrant, 0, len(held))
	for _, h := range held {
		g, ok := reads.grant(h.GrantID)
		if !ok {
			if err := reads.failed(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: holder index of %s names missing grant %s", ErrCorrupt, h.NodeID, h.GrantID)
		}
		held := capability.HeldGrant{GrantID: h.GrantID, NodeID: h.NodeID, ExpiresAt: g.ExpiresAt, Issuer: g.Issuer}
		switch e := effective(g, reads.grant, now); e.State {
		case capability.StateRevoked:
			held.Outcome, held.DecidedAt, held.RevokedBy = capability.OutcomeRevoked, e.RevokedAt, e.RevokedBy
		case capability.StateExpired:
			held.Outcome, held.DecidedAt = capability.OutcomeExpired, g.ExpiresAt
		}
		out = append(out, held)
	}
	return out, reads.failed()
}

func (s *Service) revokeGrant(ctx context.Context, caller Caller, grantID, reason string) (RevokeResult, error) {
	if err := checkID(id.Grant, "grant_id", grantID); err != nil {
		return RevokeResult{}, err
	}
	for range maxAttempts {
		now := s.cfg.Clock.Now()
		var (
			revoked capability.Grant
			raw     []byte
			already bool
			head    uint64
		)
		err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
			reads := newReader(tx)
			g, ok := reads.grant(grantID)
			if err := reads.failed(); err != nil {
				return err
			}
			if !ok {
				if _, isAgent := caller.agentNode(); isAgent {
					// An agent is refused an id that names no grant as a
					// grant it may not revoke (a bare stand-in names no
					// revoker), in the same words, so the refusal never
					// says whether another tree's grant exists.
					if _, err := capability.Revoke(capability.Grant{GrantID: grantID}, caller.Principal, caller.Roles, reason, now); err != nil {
						return err
					}
				}
				return fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, grantID)
			}
			raw = reads.seen[grantID]
			// Authority first: whether a grant is already revoked is not
			// for those who may not revoke it.
			if !capability.CanRevoke(g, caller.Principal, caller.Roles) {
				_, err := capability.Revoke(g, caller.Principal, caller.Roles, reason, now)
				return err
			}
			if effective(g, reads.grant, now).State == capability.StateRevoked {
				already = true
				var err error
				head, err = getCounter(tx, feedHeadKey)
				return err
			}
			var err error
			revoked, err = capability.Revoke(g, caller.Principal, caller.Roles, reason, now)
			if err != nil {
				return err
			}
			return reads.failed()
		})
		if err != nil {
			return RevokeResult{}, err
		}
		if already {
			return RevokeResult{Sequence: head, AlreadyRevoked: []string{grantID}}, nil
		}
		stale := false
		var seq uint64
		err = s.cfg.Store.Update(ctx, func(tx store.Txn) error {
			stale = false
			current, err := tx.Get(grantKey(grantID))
			if errors.Is(err, store.ErrNotFound) {
				stale = true // dropped since the snapshot (makeRoom): dead
				return nil
			}
			if err != nil {
				return err
			}
			if !bytes.Equal(current, raw) {
				stale = true
				return nil
			}
			seq, err = s.writeRevocations(tx, []capability.Grant{revoked})
			return err
		})
		if err != nil {
			return RevokeResult{}, err
		}
		if !stale {
			s.wakeMarker()
			return RevokeResult{GrantIDs: []string{grantID}, Sequence: seq}, nil
		}
	}
	return RevokeResult{}, fmt.Errorf("%w: revoking %s", ErrContended, grantID)
}

// revokeMany revokes the top grants among those collect names: the active
// ones no ancestor of which is also being revoked. The decision (authority
// and reason for every top grant) is made on one snapshot, before any
// write, so a refusal changes nothing; the writes then go in chunks, each
// re-checking its grants, since a revocation that races another is simply
// already done. collect also says how many nodes it read; charge, when
// set, is told those, the grants collected and the other grants of their
// chains read, each once, before the decision.
func (s *Service) revokeMany(ctx context.Context, principal string, roles []string, reason string, charge func(read int) error, collect func(tx store.ReadTxn) ([]string, int, error)) (RevokeResult, error) {
	now := s.cfg.Clock.Now()
	type planned struct {
		revoked capability.Grant
		raw     []byte
	}
	var (
		plan    []planned
		head    uint64
		already []string
	)
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		ids, nodes, err := collect(tx)
		if err != nil {
			return err
		}
		reads := newReader(tx)
		// The grants (and the feed's head, read below), then their
		// chains: on etcd a request each, not a round trip per grant.
		if err := prefetchGrants(tx, reads, ids, feedHeadKey); err != nil {
			return err
		}
		var chains []string
		for _, grantID := range ids {
			if g, ok := reads.grant(grantID); ok {
				chains = append(chains, g.Chain...)
			}
		}
		if err := prefetchGrants(tx, reads, chains); err != nil {
			return err
		}
		if charge != nil {
			// The chains' grants too: a grant's ancestors are read to
			// decide whether it is still active, and a rogue whose
			// grants each had ancestors of their own had those read for
			// nothing (they are read once each, however many chains
			// share them).
			collected := make(map[string]bool, len(ids))
			for _, id := range ids {
				collected[id] = true
			}
			ancestors := map[string]bool{}
			for _, a := range chains {
				if !collected[a] {
					ancestors[a] = true
				}
			}
			if err := charge(nodes + len(ids) + len(ancestors)); err != nil {
				return err
			}
		}
		active := make(map[string]capability.Grant, len(ids))
		revoked := map[string]capability.Grant{}
		for _, grantID := range ids {
			g, err := reads.indexed(grantID)
			if err != nil {
				return err
			}
			switch effective(g, reads.grant, now).State {
			case capability.StateActive:
				active[grantID] = g
			case capability.StateRevoked:
				revoked[grantID] = g
			}
		}
		for grantID, g := range revoked {
			if !slices.ContainsFunc(g.Chain, func(a string) bool { _, ok := revoked[a]; return ok }) {
				already = append(already, grantID)
			}
		}
		slices.Sort(already)
		if err := reads.failed(); err != nil {
			return err
		}
		tops := make([]string, 0, len(active))
		for grantID, g := range active {
			if !slices.ContainsFunc(g.Chain, func(a string) bool { _, ok := active[a]; return ok }) {
				tops = append(tops, grantID)
			}
		}
		slices.Sort(tops)
		for _, grantID := range tops {
			revoked, err := capability.Revoke(active[grantID], principal, roles, reason, now)
			if err != nil {
				return err
			}
			plan = append(plan, planned{revoked: revoked, raw: reads.seen[grantID]})
		}
		head, err = getCounter(tx, feedHeadKey)
		return err
	})
	if err != nil {
		return RevokeResult{}, err
	}
	result := RevokeResult{Sequence: head, AlreadyRevoked: already}
	for chunk := range slices.Chunk(plan, bulkChunk) {
		var (
			written, raced []string
			seq            uint64
		)
		err := s.cfg.Store.Update(ctx, func(tx store.Txn) error {
			written, raced, seq = written[:0], raced[:0], 0
			planned := make([]capability.Grant, len(chunk))
			for i, p := range chunk {
				planned[i] = p.revoked
			}
			if err := s.prefetchRevocations(tx, planned); err != nil {
				return err
			}
			var revocations []capability.Grant
			for _, p := range chunk {
				grantID := p.revoked.GrantID
				g, raw, err := getGrant(tx, grantID)
				if errors.Is(err, capability.ErrUnknownGrant) {
					continue // expired and dropped since the snapshot (makeRoom)
				}
				if err != nil {
					return err
				}
				revoked := p.revoked
				if !bytes.Equal(raw, p.raw) {
					// Changed since the snapshot: most likely revoked by
					// someone else, which is as good.
					if revoked, err = capability.Revoke(g, principal, roles, reason, now); err != nil {
						if errors.Is(err, capability.ErrGrantRevoked) {
							raced = append(raced, grantID)
							continue
						}
						if errors.Is(err, capability.ErrGrantExpired) {
							continue
						}
						return err
					}
				}
				revocations = append(revocations, revoked)
				written = append(written, grantID)
			}
			if len(revocations) == 0 {
				return nil
			}
			var err error
			seq, err = s.writeRevocations(tx, revocations)
			return err
		})
		if err != nil {
			return result, err
		}
		result.AlreadyRevoked = append(result.AlreadyRevoked, raced...)
		if len(written) > 0 {
			result.GrantIDs = append(result.GrantIDs, written...)
			result.Sequence = seq
			s.wakeMarker()
		}
	}
	if n := len(result.AlreadyRevoked); n > MaxAlreadyRevokedListed {
		result.AlreadyRevoked, result.AlreadyRevokedNotListed = result.AlreadyRevoked[:MaxAlreadyRevokedListed], n-MaxAlreadyRevokedListed
	}
	return result, nil
}

// prefetchGrants fetches together the grants of ids that reads has not
// read yet (store.Prefetch).
func prefetchGrants(tx store.ReadTxn, reads *reader, ids []string, also ...[]byte) error {
	keys := also
	for _, id := range ids {
		if _, ok := reads.seen[id]; !ok {
			keys = append(keys, grantKey(id))
		}
	}
	return store.Prefetch(tx, keys, nil)
}

// nodePrefetcher is a Tree that can fetch nodes together ahead of
// GetNodeIn (the supervisor's tree does).
type nodePrefetcher interface {
	PrefetchNodesIn(tx store.ReadTxn, nodeIDs []string) error
}

// nodeKeyer is a Tree that names the store keys of its nodes, so that
// a revocation fetches its holders with its own reads (the supervisor's
// tree does).
type nodeKeyer interface {
	NodeKeys(nodeIDs []string) [][]byte
}

// prefetchRevocations fetches together what revoking grants reads of
// each (writeRevocations): the grant, its holder (the tombstone's
// lineage), its children (whether it needs a marking job) and the feed's
// head — on etcd one request, not a round trip per grant, and the
// holders in the same request when the Tree names their keys.
func (s *Service) prefetchRevocations(tx store.ReadTxn, grants []capability.Grant) error {
	keys := [][]byte{feedHeadKey}
	prefixes := make([][]byte, 0, len(grants))
	holders := make([]string, 0, len(grants))
	for _, g := range grants {
		keys = append(keys, grantKey(g.GrantID))
		prefixes = append(prefixes, childPrefix(g.GrantID))
		holders = append(holders, g.HolderNodeID)
	}
	if k, ok := s.cfg.Tree.(nodeKeyer); ok {
		return store.Prefetch(tx, append(keys, k.NodeKeys(holders)...), prefixes)
	}
	if err := store.Prefetch(tx, keys, prefixes); err != nil {
		return err
	}
	if p, ok := s.cfg.Tree.(nodePrefetcher); ok {
		return p.PrefetchNodesIn(tx, holders)
	}
	return nil
}

// writeRevocations writes revoked grants with one tombstone each, and a
// marking job for each grant that has descendants, advancing the feed head.
// It returns the last sequence written.
func (s *Service) writeRevocations(tx store.Txn, revoked []capability.Grant) (uint64, error) {
	head, err := getCounter(tx, feedHeadKey)
	if err != nil {
		return 0, err
	}
	// The revocation was decided at g.RevokedAt, on a snapshot; it takes
	// effect now, when it commits. A refresh (or delegation) that read the
	// grant in between saw it active and minted a token at its own, later,
	// time: counted from the decision, the tombstone would leave the feed,
	// and every verifier's set, while that token still verifies. So the
	// drop is counted from the commit (rogue38i).
	committing := s.cfg.Clock.Now()
	for _, g := range revoked {
		head++
		t, err := capability.TombstoneFor(g, head)
		if err != nil {
			return 0, err
		}
		if later := capability.DropAfter(committing); later.After(t.DropAfter) {
			t.DropAfter = later
		}
		if t.Lineage, err = s.lineageOf(tx, g.HolderNodeID); err != nil {
			return 0, err
		}
		raw, err := encodeTombstone(t)
		if err != nil {
			return 0, err
		}
		if err := putGrant(tx, nil, g, false); err != nil {
			return 0, err
		}
		if err := tx.Put(tombstoneKey(head), raw); err != nil {
			return 0, err
		}
		has, err := hasDescendants(tx, g.GrantID)
		if err != nil {
			return 0, err
		}
		if has {
			if err := putMarkJob(tx, head, markJob{GrantID: g.GrantID}); err != nil {
				return 0, err
			}
		}
	}
	return head, putCounter(tx, feedHeadKey, head)
}

// lineageOf is the root of node's tree (node itself for a root).
func (s *Service) lineageOf(tx store.ReadTxn, nodeID string) (string, error) {
	n, err := s.cfg.Tree.GetNodeIn(tx, nodeID)
	if s.cfg.Tree.NodeNotFound(err) {
		return "", nil // shown to no agent: fails closed towards agents only
	}
	if err != nil {
		return "", err
	}
	if len(n.Ancestors) > 0 {
		return n.Ancestors[0], nil
	}
	return n.NodeID, nil
}

// hasDescendants says whether any grant derives from grantID: whether it
// has a child. It reads the children index, not the derived index, though
// both answer alike (neither is ever pruned): a scan that stops at its
// first key still costs etcd (3.4 to 3.6) a walk of the whole range it
// asked for, to count it (etcd-io/etcd#11057), and the derived range of a
// grant with a million descendants holds a million keys, its children
// range only its children. Revoke calls this on its request path.
func hasDescendants(tx store.ReadTxn, grantID string) (bool, error) {
	found := false
	err := tx.Scan(childPrefix(grantID), nil, func(_, _ []byte) error {
		found = true
		return store.ErrStopScan
	})
	return found, err
}

// heldIn returns the ids of the grants held by the nodes, in index order.
func heldIn(tx store.ReadTxn, nodeIDs []string) ([]string, error) {
	held, err := heldPairs(tx, nodeIDs)
	ids := make([]string, len(held))
	for i, h := range held {
		ids[i] = h.GrantID
	}
	return ids, err
}

// heldPairs lists the grants held by the nodes (no outcomes), in node
// order and, per node, in its holder index's order.
func heldPairs(tx store.ReadTxn, nodeIDs []string) ([]capability.HeldGrant, error) {
	if len(nodeIDs) > 1 {
		// One read per node: on etcd, fetch them together.
		if err := store.Prefetch(tx, nil, store.KeysOf(nodeIDs, holderPrefix)); err != nil {
			return nil, err
		}
	}
	var out []capability.HeldGrant
	for _, node := range nodeIDs {
		prefix := holderPrefix(node)
		err := tx.Scan(prefix, nil, func(k, _ []byte) error {
			out = append(out, capability.HeldGrant{GrantID: idAfter(k, prefix), NodeID: node})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// issuedBefore returns the ids of grants created before t.
func issuedBefore(tx store.ReadTxn, t time.Time) ([]string, error) {
	var ids []string
	end := issuedKey(t.UnixNano(), "")
	prefix := []byte(prefixIssued)
	err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		if bytes.Compare(k, end) >= 0 {
			return store.ErrStopScan
		}
		slash := bytes.LastIndexByte(k, '/')
		ids = append(ids, string(k[slash+1:]))
		return nil
	})
	return ids, err
}

// clipReason keeps a reason composed by a caller within the core's limit.
func clipReason(reason string) string {
	if len(reason) <= capability.MaxReasonBytes {
		return reason
	}
	cut := capability.MaxReasonBytes
	for cut > 0 && reason[cut]&0xC0 == 0x80 {
		cut-- // do not split a UTF-8 sequence
	}
	return reason[:cut]
}
