package grantstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// ToProto renders a grant as tether.v1 shows it. The state enums share
// their numbering, so the state maps by conversion.
func ToProto(g capability.Grant) *tetherv1.Grant {
	return &tetherv1.Grant{
		GrantId:       g.GrantID,
		ParentGrantId: g.ParentGrantID,
		HolderNodeId:  g.HolderNodeID,
		Issuer:        g.Issuer,
		Scopes:        g.Scopes,
		NotBefore:     timestamp(g.NotBefore),
		ExpiresAt:     timestamp(g.ExpiresAt),
		Chain:         g.Chain,
		Revokers:      g.Revokers,
		State:         tetherv1.GrantState(g.State),
		RevokedBy:     g.RevokedBy,
		RevokedAt:     timestamp(g.RevokedAt),
		Reason:        g.Reason,
		CreatedAt:     timestamp(g.CreatedAt),
		RevokedVia:    g.RevokedVia,
	}
}

// FromProto is the inverse of ToProto.
func FromProto(p *tetherv1.Grant) capability.Grant {
	return capability.Grant{
		GrantID:       p.GrantId,
		ParentGrantID: p.ParentGrantId,
		HolderNodeID:  p.HolderNodeId,
		Issuer:        p.Issuer,
		Scopes:        p.Scopes,
		NotBefore:     fromTimestamp(p.NotBefore),
		ExpiresAt:     fromTimestamp(p.ExpiresAt),
		Chain:         p.Chain,
		Revokers:      p.Revokers,
		State:         capability.State(p.State),
		RevokedBy:     p.RevokedBy,
		RevokedAt:     fromTimestamp(p.RevokedAt),
		RevokedVia:    p.RevokedVia,
		Reason:        p.Reason,
		CreatedAt:     fromTimestamp(p.CreatedAt),
	}
}

// TombstoneToProto renders a tombstone as the feed sends it.
func TombstoneToProto(t capability.Tombstone) *tetherv1.Tombstone {
	return &tetherv1.Tombstone{
		Sequence:     t.Sequence,
		GrantId:      t.GrantID,
		RevokedAt:    timestamp(t.RevokedAt),
		DropAfter:    timestamp(t.DropAfter),
		Reason:       t.Reason,
		HolderNodeId: t.Holder,
		Lineage:      t.Lineage,
	}
}

// TombstoneFromProto is the inverse of TombstoneToProto.
func TombstoneFromProto(p *tetherv1.Tombstone) capability.Tombstone {
	return capability.Tombstone{
		Sequence:  p.Sequence,
		GrantID:   p.GrantId,
		RevokedAt: fromTimestamp(p.RevokedAt),
		DropAfter: fromTimestamp(p.DropAfter),
		Reason:    p.Reason,
		Holder:    p.HolderNodeId,
		Lineage:   p.Lineage,
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func fromTimestamp(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func encodeGrant(g capability.Grant) ([]byte, error) {
	b, err := proto.Marshal(ToProto(g))
	if err != nil {
		return nil, fmt.Errorf("grantstore: encode grant %s: %w", g.GrantID, err)
	}
	return b, nil
}

func decodeGrant(id string, raw []byte) (capability.Grant, error) {
	var p tetherv1.Grant
	if err := proto.Unmarshal(raw, &p); err != nil {
		return capability.Grant{}, fmt.Errorf("%w: grant %s does not decode: %v", ErrCorrupt, id, err)
	}
	if p.GrantId != id {
		return capability.Grant{}, fmt.Errorf("%w: key of grant %s holds grant %s", ErrCorrupt, id, p.GrantId)
	}
	return FromProto(&p), nil
}

func encodeTombstone(t capability.Tombstone) ([]byte, error) {
	b, err := proto.Marshal(TombstoneToProto(t))
	if err != nil {
		return nil, fmt.Errorf("grantstore: encode tombstone %d: %w", t.Sequence, err)
	}
	return b, nil
}

func decodeTombstone(raw []byte) (capability.Tombstone, error) {
	var p tetherv1.Tombstone
	if err := proto.Unmarshal(raw, &p); err != nil {
		return capability.Tombstone{}, fmt.Errorf("%w: tombstone does not decode: %v", ErrCorrupt, err)
	}
	return TombstoneFromProto(&p), nil
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

// putGrant writes a grant. A new grant also gets its index entries; an
// update (a state change) rewrites only the grant, since no indexed field
// ever changes.
func putGrant(tx store.Txn, g capability.Grant, isNew bool) error {
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
// Delegate and IssueRoot do, without their checks. It is for tools that
// build large trees fast (benchmarks, imports); the grant must come from
// capability.NewRoot or capability.Delegate.
func PutNewGrantIn(tx store.Txn, g capability.Grant) error { return putGrant(tx, g, true) }

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
