package grantstore

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// maxPerNode is Config.MaxPerNode or its default.
func (s *Service) maxPerNode() int {
	if s.cfg.MaxPerNode > 0 {
		return s.cfg.MaxPerNode
	}
	return DefaultMaxPerNode
}

// makeRoom bounds the grants of g's holder, inside tx, the transaction that
// writes g, a new grant: it refuses g (ErrLimit) when the holder already
// holds MaxPerNode live grants of g's kind — delegated by agents, or
// issued by operators: counted apart, so that an agent cannot fill the
// node's share of an operator's roots — and drops the holder's oldest dead
// grants of that kind (revoked, or expired) past as many again.
//
// A dead grant another grant derives from is kept: a chain names every
// ancestor, and a verifier, the marker and every read path look them up.
// Its descendants are dead too (revocation covers them, and none outlives
// its parent), and once their own holders drop them it goes too. Dropping
// a grant deletes it with its index entries; its tombstone stays in the
// feed until its DropAfter, as any other.
//
// The holder's index is read first: with fewer entries than the bound,
// the holder holds fewer live and fewer dead grants of either kind than
// the bound, and no grant is read. Past it, every grant the index names is
// read, and each one's chain: the index keeps every dead grant another
// derives from, so it may name many more than the bound. charge, when set,
// is told how many grants were read then (every grant and ancestor), before
// the grant is refused or room made: a delegation's caller pays for them
// (DelegateRequest.Charge). The index's keys alone are not counted.
func (s *Service) makeRoom(tx store.Txn, g capability.Grant, now time.Time, charge func(read int) error) error {
	limit := s.maxPerNode()
	prefix := holderPrefix(g.HolderNodeID)
	var ids []string
	err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		ids = append(ids, idAfter(k, prefix))
		return nil
	})
	if err != nil {
		return err
	}
	if len(ids) < limit {
		return nil
	}
	reads := newReader(tx)
	if err := prefetchGrants(tx, reads, ids); err != nil {
		return err
	}
	byAgent := strings.HasPrefix(g.Issuer, capability.AgentPrefix)
	var (
		live int
		dead []capability.Grant
	)
	for _, grantID := range ids {
		h, err := reads.indexed(grantID)
		if err != nil {
			return err
		}
		if strings.HasPrefix(h.Issuer, capability.AgentPrefix) != byAgent {
			continue
		}
		if effective(h, reads.grant, now).State == capability.StateActive {
			live++
		} else {
			dead = append(dead, h)
		}
	}
	if err := reads.failed(); err != nil {
		return err
	}
	if charge != nil {
		if err := charge(len(reads.seen)); err != nil {
			return err
		}
	}
	if over := len(dead) - limit; over > 0 {
		slices.SortFunc(dead, func(a, b capability.Grant) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for _, h := range dead {
			if over == 0 {
				break
			}
			parent, err := hasChildren(tx, h.GrantID)
			if err != nil {
				return err
			}
			if parent {
				continue
			}
			if err := dropGrant(tx, h); err != nil {
				return err
			}
			over--
		}
	}
	if live >= limit {
		who := "delegated by agents"
		if !byAgent {
			who = "issued by operators"
		}
		return fmt.Errorf("%w: node %s already holds %d live grants %s, the maximum per node (tether serve --grant-max-per-node); revoke some or let them expire first", ErrLimit, g.HolderNodeID, live, who)
	}
	return nil
}

// hasChildren reports whether a grant was delegated from.
func hasChildren(tx store.ReadTxn, grantID string) (bool, error) {
	found := false
	err := tx.Scan(childPrefix(grantID), nil, func(_, _ []byte) error {
		found = true
		return store.ErrStopScan
	})
	return found, err
}

// dropGrant deletes a grant no other grant derives from, with every index
// entry putGrant wrote for it.
func dropGrant(tx store.Txn, g capability.Grant) error {
	keys := [][]byte{grantKey(g.GrantID), holderKey(g.HolderNodeID, g.GrantID), issuedKey(g.CreatedAt.UnixNano(), g.GrantID)}
	if g.ParentGrantID != "" {
		keys = append(keys, childKey(g.ParentGrantID, g.GrantID))
	}
	for _, ancestor := range g.Chain {
		keys = append(keys, derivedKey(ancestor, g.GrantID))
	}
	for _, k := range keys {
		if err := tx.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
