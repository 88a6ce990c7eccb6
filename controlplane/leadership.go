package controlplane

import (
	"context"
	"fmt"

	"github.com/tetherhq/tether/controlplane/leader"
)

// runnableComponents is what Run starts: every component registered with
// addComponent, and, if any were registered with addLeaderComponent, one
// more, "leader", that runs those as a group whenever this replica leads.
func (s *Server) runnableComponents() []component {
	var everywhere, leaderOnly []component
	for _, c := range s.components {
		if c.leaderOnly {
			leaderOnly = append(leaderOnly, c)
		} else {
			everywhere = append(everywhere, c)
		}
	}
	if len(leaderOnly) == 0 {
		return everywhere
	}
	elector := s.cfg.Elector
	if elector == nil {
		elector = leader.Always{}
	}
	return append(everywhere, component{
		name: "leader",
		run: func(ctx context.Context) error {
			return elector.Lead(ctx, func(ctx context.Context) error {
				s.log.Info("running the leader-only components", "count", len(leaderOnly))
				return s.runGroup(ctx, leaderOnly)
			})
		},
	})
}

// runGroup runs components until ctx ends or one of them returns, then
// cancels the others and waits for them. When ctx ended first (leadership
// lost, or shutdown) it returns nil; otherwise it returns the first
// component's error, or an error naming it if it returned nil — a
// component that stops on its own while its replica leads is a failure,
// as it is among the components that run everywhere.
func (s *Server) runGroup(parent context.Context, components []component) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(components))
	for _, c := range components {
		go func() { results <- result{c.name, c.run(ctx)} }()
	}
	first := <-results
	cancel()
	for range len(components) - 1 {
		<-results
	}
	switch {
	case parent.Err() != nil:
		return nil
	case first.err != nil:
		return fmt.Errorf("leader-only component %s: %w", first.name, first.err)
	}
	return fmt.Errorf("leader-only component %s stopped", first.name)
}
