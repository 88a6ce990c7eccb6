package wire

import (
	"github.com/tetherhq/tether/capability"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Grant renders a grant as tether.v1 shows it. The state enums share
// their numbering, so the state maps by conversion.
func Grant(g capability.Grant) *tetherv1.Grant {
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

// GrantFromProto is the inverse of Grant; a nil grant is the zero
// grant.
func GrantFromProto(p *tetherv1.Grant) capability.Grant {
	if p == nil {
		return capability.Grant{}
	}
	return capability.Grant{
		GrantID:       p.GrantId,
		ParentGrantID: p.ParentGrantId,
		HolderNodeID:  p.HolderNodeId,
		Issuer:        p.Issuer,
		Scopes:        p.Scopes,
		NotBefore:     timeOf(p.NotBefore),
		ExpiresAt:     timeOf(p.ExpiresAt),
		Chain:         p.Chain,
		Revokers:      p.Revokers,
		State:         capability.State(p.State),
		RevokedBy:     p.RevokedBy,
		RevokedAt:     timeOf(p.RevokedAt),
		RevokedVia:    p.RevokedVia,
		Reason:        p.Reason,
		CreatedAt:     timeOf(p.CreatedAt),
	}
}

// Tombstone renders a tombstone as the revocation feed sends it.
func Tombstone(t capability.Tombstone) *tetherv1.Tombstone {
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
