package controlplane

import (
	"context"
	"errors"

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
