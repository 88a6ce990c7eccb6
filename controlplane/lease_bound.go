package controlplane

import (
	"context"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// applyBounded judges an offer or a reassignment by p within the bounds
// on open leases (Config.LeaseMaxOpenPerHolder, LeaseMaxOpenPerLineage),
// the new holder's lease counted under lineage. An agent is held to both;
// an operator to the bound per holder only: the lineage's bound is its
// agents' share, which one rogue agent of the lineage can fill (with
// leases its own child never acknowledges, expired and still open until
// a reassignment or a resolution ends them), and it must not lock out
// the operators who can stop the rogue or place the work elsewhere. The
// operator's lease counts in the lineage all the same, so the lineage's
// agents offer no more for it.
func (h *leaseService) applyBounded(ctx context.Context, p auth.Principal, m lease.Message, guard func(lease.Lease) error, lineage string) (coordinator.Result, error) {
	if p.IsAgent() {
		return h.leases().ApplyBounded(ctx, m, guard, lineage)
	}
	return h.leases().ApplyHolderBounded(ctx, m, guard, lineage)
}
