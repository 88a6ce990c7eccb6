package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/supervisor/tree"
)

// leaseLineages is the lineage (the root of its tree) of each of holders
// that names an agent, for the bounds on open leases: the lease
// coordinator counts a holder's open leases under its lineage
// (coordinator.Config.Accounts), and asks for those its load found.
func (s *Server) leaseLineages(ctx context.Context, holders []string) (map[string]string, error) {
	out := make(map[string]string, len(holders))
	for _, holder := range holders {
		n, err := s.tree.Get(ctx, holder)
		if errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[holder] = tree.Root(n)
	}
	return out, nil
}

// leaseHolderReadTimeout bounds the read of a holder's node an automatic
// reassignment waits for on a lease shard (leaseHolderUnavailable).
const leaseHolderReadTimeout = 5 * time.Second

// leaseHolderUnavailable says why holder cannot take the next generation
// of a job whose ACK it missed ("" when it can): it is not a registered
// agent, it is being stopped or is stopped (or a termination covers it),
// or its exit was claimed or confirmed. The lease coordinator asks it
// before an automatic reassignment (coordinator.Config.HolderUnavailable)
// and withholds the reassignment when it answers; the job then stays
// EXPIRED until its lineage moves it on. A node that cannot be read is
// taken for unavailable: safety over the job's liveness. The text goes
// into the evidence row; it names the node's state, never the error.
func (s *Server) leaseHolderUnavailable(ctx context.Context, holder string) string {
	ctx, cancel := context.WithTimeout(ctx, leaseHolderReadTimeout)
	defer cancel()
	n, cover, err := s.tree.GetUnder(ctx, holder)
	switch {
	case errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument):
		return fmt.Sprintf("%s is not a registered agent", holder)
	case err != nil:
		s.log.Warn("lease: the holder of an automatic reassignment could not be read; the reassignment is withheld", "holder", holder, "err", err)
		return fmt.Sprintf("agent %s's node could not be read", holder)
	case n.State != tree.NodeStateRunning:
		return fmt.Sprintf("agent %s is %s", holder, tree.StateName(n.State))
	case cover != nil:
		return cover.Describe(holder)
	case tree.ExitConfirmed(n):
		return fmt.Sprintf("agent %s's exit was claimed or confirmed", holder)
	}
	return ""
}
