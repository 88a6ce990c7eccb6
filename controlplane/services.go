package controlplane

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/rollout"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// buildComponents creates the domain services on top of the store, in
// dependency order, and registers their background loops.
func (s *Server) buildComponents(ctx context.Context) error {
	leasePolicy := lease.DefaultPolicy()
	if s.cfg.LeasePolicy != nil {
		leasePolicy = *s.cfg.LeasePolicy
	}
	leases, err := coordinator.New(ctx, coordinator.Config{
		Store: s.store, Clock: s.cfg.Clock, Policy: leasePolicy, Log: s.log,
		MaxOpenPerHolder: max(0, s.cfg.LeaseMaxOpenPerHolder), MaxOpenPerAccount: max(0, s.cfg.LeaseMaxOpenPerLineage),
		OpenReservePerHolder: LeaseReservePerNode,
		Accounts:             s.leaseLineages,
		HolderUnavailable:    s.leaseHolderUnavailable,
	})
	if err != nil {
		return err
	}
	s.leases = leases
	// Leader-only (leadership.go): the leases live in memory on the leader,
	// which rebuilds them from the store each time it gains the lead; the
	// other replicas forward LeaseService to it (forward.go).
	s.addLeaderComponent("leases", leases.Run)
	s.buildLeaseRouting()
	grants, err := grantstore.New(grantstore.Config{
		Store: s.store, Tree: grantTree{s.tree}, Clock: s.cfg.Clock, Keys: s.keys.Get, Issuer: s.cfg.Issuer,
		TokenTTL: s.cfg.CapabilityTokenTTL, Heartbeat: s.cfg.RevocationHeartbeat, Log: s.log,
		OnPublish: s.tombstonePublished, MaxPerNode: s.cfg.GrantMaxPerNode,
	})
	if err != nil {
		return err
	}
	s.grants = grants
	s.addComponent("grants-feed", grants.RunFeed)
	s.addLeaderComponent("grants-marker", grants.RunMarker)
	s.addLeaderComponent("grants-pruner", grants.RunPruner)
	s.ledger = &ledger.Ledger{Store: s.store, Clock: s.cfg.Clock, AckWindow: supervisor.CancelAckWindow, Fault: s.cfg.LedgerFault}
	s.privileges = &privilege.Privileges{
		Store: s.store, Clock: s.cfg.Clock, Handlers: s.cfg.PrivilegeHandlers,
		AllowHooks: s.cfg.PrivilegeHookAllow, MaxPerNode: s.cfg.PrivilegeMaxPerNode, Log: s.log,
	}
	s.signals = &tree.Signals{Store: s.store, Clock: s.cfg.Clock, Log: s.log}
	s.supervisor = &supervisor.Supervisor{
		Store: s.store, Clock: s.cfg.Clock, Tree: s.tree, Ledger: s.ledger,
		Privileges: s.privileges, Sink: s.recordSink(), Log: s.log, HookTimeout: s.cfg.PrivilegeHookTimeout,
		ChunkSize: s.cfg.TerminationChunk, LeasePageBytes: s.cfg.TerminationLeasePage, ChunkFault: s.cfg.TerminationFault,
		Reconciled: s.cfg.TerminationReconciled,
	}
	s.supervisor.Leases = leaseCanceller{s.leases}
	s.ledger.Tokens = s.grants
	s.supervisor.Grants = s.grants
	s.addLeaderComponent("supervisor", s.afterLeases(s.supervisor.Run))
	// Stop rules (stoprule_handler.go): counters kept in the ledger's and
	// the tree's transactions; one evaluator per cluster.
	if !s.cfg.DisableStopRules {
		s.stopRules = &stoprule.Rules{
			Store: s.store, Clock: s.cfg.Clock, Supervisor: s.supervisor, Policy: s.cfg.StopPolicy,
			Leases: s.leases, Grants: s.grants, Log: s.log, Fault: s.cfg.StopRuleFault,
		}
		s.ledger.Observer = s.stopRules
		s.supervisor.CallCount = s.stopRules.CallCount
		s.tree.Observer = s.stopRules
		s.addLeaderComponent("stop-rules", s.afterLeases(s.stopRules.Run))
	}
	s.addComponent("session-signals", s.signals.Run)
	s.addLeaderComponent("record-outbox", (&supervisor.Outbox{Supervisor: s.supervisor, Render: wire.RenderRecord, Retry: s.cfg.RecordRetry}).Run)
	// Rollouts (rollout.go, rollout_handler.go) and key rotation (keys.go).
	handover := leaseHandover{leases: s.leases}
	s.supervisor.Handover = handover
	s.rollouts = &rollout.Rollouts{Store: s.store, Clock: s.cfg.Clock, Supervisor: s.supervisor, Handover: handover, Log: s.log, Fault: s.cfg.RolloutFault}
	s.addLeaderComponent("rollouts", s.afterLeases(s.rollouts.Run))
	s.addComponent("key-ring", s.followKeyRing)
	s.addLeaderComponent("key-pruner", s.pruneKeyRing)
	return nil
}

// recordSink is where records go besides the store: <data-dir>/records by
// default, and the webhook when configured.
func (s *Server) recordSink() supervisor.RecordSink {
	var sinks supervisor.MultiSink
	dir := s.cfg.RecordDir
	if dir == "" && s.cfg.DataDir != "" {
		dir = filepath.Join(s.cfg.DataDir, "records")
	}
	if dir != "" {
		sinks = append(sinks, supervisor.DirSink{Dir: dir})
	}
	if s.cfg.RecordWebhook != "" {
		sinks = append(sinks, supervisor.WebhookSink{URL: s.cfg.RecordWebhook})
	}
	if len(sinks) == 0 {
		return nil
	}
	return sinks
}

// compressMinBytes is the smallest answer the services gzip for a client
// that accepts it. Nearly every answer is a few hundred bytes, which gzip
// barely shrinks, and each compression resets a flate compressor (tens of
// KiB of tables): it was a tenth of the server's CPU while registering and
// terminating a large swarm. Lists, records and evidence pages are larger
// and still compressed.
const compressMinBytes = 4 << 10

// mountServices registers one Connect handler per service.
func (s *Server) mountServices(mux *http.ServeMux, opts []connect.HandlerOption) {
	opts = append(slices.Clip(opts), connect.WithCompressMinBytes(compressMinBytes))
	mux.Handle(tetherv1connect.NewAuthServiceHandler(&authService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewAgentServiceHandler(&agentService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewCapabilityServiceHandler(&capabilityService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewLeaseServiceHandler(s.leaseHandler(), append(opts, leaseHandlerOptions...)...))
	mux.Handle(tetherv1connect.NewToolServiceHandler(&toolService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewSupervisorServiceHandler(&supervisorService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewStopRuleServiceHandler(&stopRuleService{s: s}, opts...))
}

// StopRuleStats are the stop-rule evaluator's counters (nil when stop
// rules are disabled).
func (s *Server) StopRuleStats() *stoprule.Stats {
	if s.stopRules == nil {
		return nil
	}
	return s.stopRules.Stats()
}
