package grantstore

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
)

func encodeGrant(g capability.Grant) ([]byte, error) {
	b, err := storecodec.Marshal(&g)
	if err != nil {
		return nil, fmt.Errorf("grantstore: encode grant %s: %w", g.GrantID, err)
	}
	return b, nil
}

func decodeGrant(id string, raw []byte) (capability.Grant, error) {
	var g capability.Grant
	if err := storecodec.Unmarshal(raw, &g); err != nil {
		return capability.Grant{}, fmt.Errorf("%w: grant %s does not decode: %v", ErrCorrupt, id, err)
	}
	if g.GrantID != id {
		return capability.Grant{}, fmt.Errorf("%w: key of grant %s holds grant %s", ErrCorrupt, id, g.GrantID)
	}
	return g, nil
}

func encodeTombstone(t capability.Tombstone) ([]byte, error) {
	b, err := storecodec.Marshal(&t)
	if err != nil {
		return nil, fmt.Errorf("grantstore: encode tombstone %d: %w", t.Sequence, err)
	}
	return b, nil
}

func decodeTombstone(raw []byte) (capability.Tombstone, error) {
	var t capability.Tombstone
	if err := storecodec.Unmarshal(raw, &t); err != nil {
		return capability.Tombstone{}, fmt.Errorf("%w: tombstone does not decode: %v", ErrCorrupt, err)
	}
	return t, nil
}

// getGrant reads one grant; a missing grant is capability.ErrUnknownGrant.
func getGrant(tx store.ReadTxn, id string) (capability.Grant, []byte, error) {
	raw, err := tx.Get(grantKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return capability.Grant{}, nil, fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, id)
	}
	if err != nil {
		return capability.Grant{}, nil, err
	}
	g, err := decodeGrant(id, raw)
	return g, raw, err
}

// putGrant writes a grant. A new grant also gets its index entries, and
// its holder is noted (holders); an update (a state change) rewrites only
// the grant, since no indexed field ever changes.
func putGrant(tx store.Txn, holders HolderNoter, g capability.Grant, isNew bool) error {
	raw, err := encodeGrant(g)
	if err != nil {
		return err
	}
	if err := tx.Put(grantKey(g.GrantID), raw); err != nil {
		return err
	}
	if !isNew {
		return nil
	}
	if err := tx.Put(holderKey(g.HolderNodeID, g.GrantID), nil); err != nil {
		return err
	}
	if err := holders.NoteHolderIn(tx, g.HolderNodeID); err != nil {
		return err
	}
	if g.ParentGrantID != "" {
		if err := tx.Put(childKey(g.ParentGrantID, g.GrantID), nil); err != nil {
			return err
		}
	}
	for _, ancestor := range g.Chain {
		if err := tx.Put(derivedKey(ancestor, g.GrantID), nil); err != nil {
			return err
		}
	}
	return tx.Put(issuedKey(g.CreatedAt.UnixNano(), g.GrantID), nil)
}

// PutNewGrantIn writes a new grant and its index entries inside tx, as
// Delegate and IssueRoot do, without their checks, and notes its holder in
// holders (the agent tree, tree.Tree). It is for tools that build large
// trees fast (benchmarks, imports); the grant must come from
// capability.NewRoot or capability.Delegate.
func PutNewGrantIn(tx store.Txn, holders HolderNoter, g capability.Grant) error {
	return putGrant(tx, holders, g, true)
}

func getCounter(tx store.ReadTxn, key []byte) (uint64, error) {
	raw, err := tx.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s = %q", ErrCorrupt, key, raw)
	}
	return n, nil
}

func putCounter(tx store.Txn, key []byte, n uint64) error {
	return tx.Put(key, strconv.AppendUint(nil, n, 10))
}
