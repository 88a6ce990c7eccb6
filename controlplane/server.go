// Package controlplane wires Tether's control plane: the store, the key ring,
// the Connect handlers of every service, authentication and observability,
// served on one port (Connect, gRPC and gRPC-Web; HTTP/2 cleartext by
// default, TLS when configured).
//
// Interceptor order, outermost first: observe (span, metrics, log) → auth
// (authenticate, then the procedure's rule) → handler. Panics are recovered
// by connect.WithRecover and become Internal errors.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/console"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
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

// Config configures a control plane.
type Config struct {
	// DataDir holds admin.token, the records, and the Badger store unless
	// Store is set.
	DataDir string
	// Listen is the address to serve on, e.g. "127.0.0.1:7420".
	Listen string
	// TLSCert and TLSKey enable TLS; one without the other is an error.
	TLSCert, TLSKey string
	// TLSClientCA, when set, makes TLS mutual: every client must present a
	// certificate this CA (a PEM file) signed.
	TLSClientCA string
	// InsecurePlaintext allows serving without TLS on an address other
	// machines can reach (New refuses otherwise); the server warns.
	InsecurePlaintext bool
	// Conn bounds connections, request times and open streams; zero fields
	// take DefaultConnLimits.
	Conn ConnLimits
	// Store overrides the embedded Badger store (tests, etcd). The server
	// does not close a store it was given.
	Store  store.Store
	Clock  clock.Clock
	Logger *slog.Logger
	// Elector decides when this replica runs the leader-only components;
	// nil means leader.Always (a single replica). Replicas sharing an etcd
	// store use a leader.Etcd, whose Address the others forward job-lease
	// calls to while it leads (forward.go).
	Elector leader.Elector
	// PeerTLS verifies the leader's certificate when job-lease calls are
	// forwarded to an https:// address; nil means the system roots.
	PeerTLS *tls.Config
	// Issuer is the `iss` of every token; default "tether".
	Issuer string
	// AgentCredentialTTL bounds agent credentials (refreshed over the session).
	AgentCredentialTTL time.Duration
	// AdminTokenTTL is the lifetime of the bootstrap admin token.
	AdminTokenTTL time.Duration
	// MaxRequestBytes bounds every request message.
	MaxRequestBytes int
	// TreeLimits bound the agent tree (depth, children per node, labels);
	// the zero value means tree.DefaultLimits. MaxLabels above
	// stoprule.MaxLabels (32) is refused: the stop rules' cost estimate
	// bounds a node's labels there.
	TreeLimits tree.Limits
	// RecordDir receives each reconciliation record as JSON; default
	// <data-dir>/records.
	RecordDir string
	// RecordWebhook, when set, receives each record by POST (retried until
	// delivered).
	RecordWebhook string
	// RecordRetry is the first wait after a failed record delivery,
	// doubling up to a minute; zero means the outbox's default (2s).
	RecordRetry time.Duration
	// PrivilegeHandlers revoke privileges of a kind in process.
	PrivilegeHandlers map[string]privilege.PrivilegeRevoker
	// PrivilegeHookAllow are the destinations a privilege's revoke_url may
	// name (hosts, host:port or URL prefixes; see privilege.Privileges).
	// Empty: no revoke webhooks are accepted.
	PrivilegeHookAllow []string
	// PrivilegeMaxPerNode bounds the live privileges of one node; zero
	// means privilege.DefaultMaxPrivilegesPerNode.
	PrivilegeMaxPerNode int
	// GrantMaxPerNode bounds the live grants one node holds, those agents
	// delegated and the roots operators issued apart; zero means
	// grantstore.DefaultMaxPerNode.
	GrantMaxPerNode int
	// PrivilegeHookTimeout bounds, in total, a termination's privilege
	// revocations; zero means supervisor.DefaultHookTimeout.
	PrivilegeHookTimeout time.Duration
	// LeaseMaxOpenPerHolder bounds the open (not terminal) job leases one
	// agent holds, LeaseMaxOpenPerLineage those the agents of one lineage
	// hold together: an offer or reassignment past either is refused
	// resource_exhausted (an operator's is held to the bound per holder
	// only; its lease counts in the lineage). The lineage's bound counts
	// only the leases each agent holds past its own LeaseReservePerNode.
	// Zero means DefaultLeaseMaxOpenPerHolder and
	// DefaultLeaseMaxOpenPerLineage, negative no bound.
	LeaseMaxOpenPerHolder, LeaseMaxOpenPerLineage int
	// TerminationChunk bounds the nodes (or tool calls) one transaction
	// of a termination handles; zero means supervisor.DefaultChunkSize.
	TerminationChunk int
	// TerminationLeasePage bounds the encoded leases one part of a
	// termination's record carries, and so its grants, and the held index
	// one transaction of its revocation writes; zero means
	// supervisor.DefaultLeasePageBytes.
	TerminationLeasePage int
	// TerminationFault, when set, is called after each chunk of a
	// termination commits (see supervisor.Supervisor.ChunkFault). Tests
	// only.
	TerminationFault func(step string, n int)
	// LedgerFault, when set, is called by the tool-call ledger at
	// "token-checked": a call's token was checked, before the transaction
	// that begins the call (see ledger.Ledger.Fault). Tests only.
	LedgerFault func(point string)
	// TerminationReconciled, when set, is called as each reconcile of a
	// termination begins (see supervisor.Supervisor.Reconciled). Tests
	// only.
	TerminationReconciled func(terminationID string)
	// LeasePolicy is the job-lease coordinator's declared time policy
	// (ACK-miss policy, its bound on automatic reassignments, durations);
	// nil means lease.DefaultPolicy(). An incoherent one stops the server
	// at start (lease.Policy.Validate).
	LeasePolicy *lease.Policy
	// StopPolicy decides which stop proposals are approved automatically
	// (agents' own, and those stop rules file: RuleActions).
	StopPolicy supervisor.ProposalPolicy
	// StopRuleFault, when set, is called by the stop-rule evaluator at
	// "before-file" and "after-file"; an error stops the server as a crash
	// would. Tests only.
	StopRuleFault func(point string) error
	// RolloutFault, when set, is called by the rollout reconciler at
	// "before-start-batch": after it chose a batch's agents from what it
	// observed, before the transaction that starts the batch; and at
	// "before-reassign", before each lease a handover pass reassigns; and
	// at "observe", as each observation of a rollout's facts begins (see
	// rollout.Rollouts.Fault). Tests only.
	RolloutFault func(point string)
	// DisableStopRules runs without stop rules: no per-node counters in
	// the ledger's and the tree's transactions and no evaluator (the
	// benchmark's baseline for their added cost). StopRuleService answers
	// unavailable.
	DisableStopRules bool
	// RateLimit is each budget's sustained request rate per second, with
	// bursts of RateBurst (default 2×RateLimit). Zero: unlimited. An agent
	// shares one budget with its whole lineage (its root and every
	// descendant); an operator has its own. Every stream message costs one
	// request, like a unary call.
	RateLimit float64
	RateBurst float64
	// AnonymousRateLimit bounds, per source address (an IPv6 address's
	// /64), the requests that carry no valid credential (bursts of twice
	// that); zero: unlimited.
	AnonymousRateLimit float64
	// OperatorTokenTTL is the lifetime of a token CreateToken mints when
	// the request names none; default 24h.
	OperatorTokenTTL time.Duration
	// CapabilityTokenTTL is the lifetime of capability tokens; default
	// capability.DefaultTokenTTL, at most capability.MaxTokenTTL.
	CapabilityTokenTTL time.Duration
	// RevocationHeartbeat is how often WatchRevocations tells an idle
	// follower the feed head; default grantstore.DefaultHeartbeat.
	RevocationHeartbeat time.Duration
}

func (c *Config) defaults() {
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if c.Issuer == "" {
		c.Issuer = "tether"
	}
	if c.AgentCredentialTTL == 0 {
		c.AgentCredentialTTL = 15 * time.Minute
	}
	if c.AdminTokenTTL == 0 {
		c.AdminTokenTTL = 365 * 24 * time.Hour
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 1 << 20
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7420"
	}
	if c.OperatorTokenTTL == 0 {
		c.OperatorTokenTTL = 24 * time.Hour
	}
	if c.LeaseMaxOpenPerHolder == 0 {
		c.LeaseMaxOpenPerHolder = DefaultLeaseMaxOpenPerHolder
	}
	if c.LeaseMaxOpenPerLineage == 0 {
		c.LeaseMaxOpenPerLineage = DefaultLeaseMaxOpenPerLineage
	}
	c.Conn.defaults()
}

// The bounds on open job leases (Config.LeaseMaxOpenPerHolder,
// LeaseMaxOpenPerLineage) when none is given. An open lease costs the
// server its memory, its deadlines and its upkeep until its job ends, and
// a termination of its holder a cancel and a resolution: without a bound,
// a lineage that offered its child twenty thousand jobs (a few seconds of
// its rate budget) made every one of them the child's stop's work. A
// holder may keep 4,096 jobs open, more than its upkeep allowance keeps
// alive (controlplane.LeaseUpkeepNodeRate); a lineage 16,384 together.
// Terminal leases are not counted: an honest worker's finished jobs stay
// its own for as long as the store keeps them.
const (
	DefaultLeaseMaxOpenPerHolder  = 4096
	DefaultLeaseMaxOpenPerLineage = 16384
)

// LeaseReservePerNode is how many open job leases each agent node may
// hold beyond its lineage's share (Config.LeaseMaxOpenPerLineage, which
// counts only the leases each node holds past this), within its own
// bound (LeaseMaxOpenPerHolder): a member of the lineage that filled the
// share — offering its own children jobs they never acknowledge — cannot
// keep a sibling from the leases it is offered. Four, a worker's few
// jobs at once; a rogue's children each bring four, and each was a spawn
// its lineage paid for, as with StreamReserve. A lineage of N nodes so
// holds at most its share and LeaseReservePerNode·N open leases.
const LeaseReservePerNode = 4

// Server is one control-plane process.
type Server struct {
	cfg        Config
	store      store.Store
	ownStore   bool
	health     healthProbe // /healthz
	keys       *keyRing
	issuer     auth.Issuer
	tree       *tree.Tree
	active     *activeNodes // nil: every agent call reads its node
	ledger     *ledger.Ledger
	privileges *privilege.Privileges
	signals    *tree.Signals
	// streams counts agents' open streams that are not sessions, per
	// node (streamOpened).
	streams    agentStreams
	supervisor *supervisor.Supervisor
	rollouts   *rollout.Rollouts
	stopRules  *stoprule.Rules
	leases     *coordinator.Coordinator
	router     *leaseRouter    // nil with a single replica (forward.go)
	allowance  *leaseAllowance // each held lease's upkeep allowance (lease_allowance.go)
	grants     *grantstore.Service
	log        *slog.Logger
	handler    http.Handler // Handler: served returned with its deadlines
	served     http.Handler // Run: the http.Server sets the deadlines
	authn      *auth.Interceptor
	conns      atomic.Pointer[connLimiter]
	throttled  atomic.Int64 // connections waiting for their frame budget
	metrics    *metrics     // metrics.go
	components []component
	// AdminTokenPath is where the bootstrap admin token was written ("" when
	// the server runs without a data directory).
	AdminTokenPath string
}

// New opens the store, loads the key ring and builds the handlers.
func New(ctx context.Context, cfg Config) (*Server, error) {
	cfg.defaults()
	if cfg.TreeLimits.MaxLabels > stoprule.MaxLabels {
		// The stop rules' cost estimate bounds a node's labels: a rule
		// accepted within the budget would cost past it on a node with
		// more, and fail without firing.
		return nil, fmt.Errorf("controlplane: TreeLimits.MaxLabels is %d, more than %d, the labels a node may have for the stop rules' cost estimate (stoprule.MaxLabels)", cfg.TreeLimits.MaxLabels, stoprule.MaxLabels)
	}
	if err := cfg.CheckTransport(); err != nil {
		return nil, err
	}
	if err := cfg.Conn.check(); err != nil {
		return nil, err
	}
	if cfg.Conn.fileLimited > 0 {
		cfg.Logger.Warn("the open-file limit leaves room for fewer connections than --max-connections; serving at most what fits (raise ulimit -n to serve more)",
			"max_connections", cfg.Conn.MaxConnections, "asked", cfg.Conn.fileLimited, "open_file_limit", openFileLimit())
	}
	if cfg.TLSCert == "" && !loopback(cfg.Listen) {
		cfg.Logger.Warn("serving plaintext on an address other machines can reach (--insecure-plaintext): credentials cross the network in the clear unless something in front encrypts them", "addr", cfg.Listen)
	}
	s := &Server{cfg: cfg, store: cfg.Store, log: cfg.Logger}
	s.allowance = &leaseAllowance{now: cfg.Clock.Now, node: &auth.RateLimiter{Rate: LeaseUpkeepNodeRate, Burst: LeaseUpkeepNodeBurst, Now: cfg.Clock.Now}}
	if cfg.DataDir != "" {
		if err := privateDir(cfg.DataDir, cfg.Logger); err != nil {
			return nil, err
		}
	}
	if s.store == nil {
		if cfg.DataDir == "" {
			return nil, errors.New("controlplane: a data directory or a store is required")
		}
		b, err := badgerstore.OpenBadger(filepath.Join(cfg.DataDir, "store"), badgerstore.BadgerOptions{Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		s.store, s.ownStore = b, true
	}
	if err := migrate(ctx, s.store); err != nil {
		s.Close()
		return nil, err
	}
	s.active = newActiveNodes(s.store)
	keys, _, err := loadOrCreateKeyRing(ctx, s.store, cfg.Clock.Now())
	if err != nil {
		s.Close()
		return nil, err
	}
	s.keys = keys
	s.issuer = auth.Issuer{Name: cfg.Issuer, Ring: keys.Get}
	limits := cfg.TreeLimits
	if limits == (tree.Limits{}) {
		limits = tree.DefaultLimits
	}
	s.tree = &tree.Tree{Store: s.store, Clock: cfg.Clock, Limits: limits, Instance: id.New(id.Session)}
	if s.ownStore {
		// This process alone owns the data directory: the sessions its
		// previous life served ended with it.
		if n, err := s.tree.CloseStaleSessions(ctx); err != nil {
			s.Close()
			return nil, fmt.Errorf("controlplane: close the sessions of a previous run: %w", err)
		} else if n > 0 {
			s.log.Info("closed the sessions of a previous run", "sessions", n)
		}
	}
	s.metrics = newMetrics(s)
	if err := s.buildComponents(ctx); err != nil {
		s.Close()
		return nil, err
	}
	// The indexes of proposals by node and of records by tree and
	// requester, over what a version before them stored: complete before
	// the server serves a read of them (once; then one key is read).
	if n, err := s.supervisor.IndexStored(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("controlplane: index the stored proposals and records: %w", err)
	} else if n > 0 {
		s.log.Info("indexed the stored proposals and records", "entries", n)
	}
	// The roots' index (ListNodes one_level), over the roots a version
	// before it stored: once, then one key is read.
	if n, err := s.tree.IndexRoots(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("controlplane: index the stored roots: %w", err)
	} else if n > 0 {
		s.log.Info("indexed the stored roots", "roots", n)
	}
	if cfg.DataDir != "" {
		if err := s.bootstrapAdminToken(); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.buildHandler(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// bootstrapAdminToken writes <data-dir>/admin.token (0600) on first start.
func (s *Server) bootstrapAdminToken() error {
	path := filepath.Join(s.cfg.DataDir, "admin.token")
	s.AdminTokenPath = path
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	token, _, _, err := s.issuer.MintOperator("admin", auth.RoleAdmin, s.cfg.Clock.Now(), s.cfg.AdminTokenTTL)
	if err != nil {
		return err
	}
	// Recorded, so that it can be listed and revoked (tether token
	// rotate-admin) like any other.
	if _, err := s.recordToken(context.Background(), token, "bootstrap"); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("controlplane: write admin token: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("controlplane: write admin token: %w", err)
	}
	s.log.Info("created the admin token", "path", path)
	return nil
}

// Issuer returns the token issuer (tests and the demo mint tokens with it).
func (s *Server) Issuer() auth.Issuer { return s.issuer }

// Store returns the server's store.
func (s *Server) Store() store.Store { return s.store }

// Handler returns the HTTP handler serving every endpoint, giving each
// request its read and write deadlines (ConnLimits) itself.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) buildHandler() error {
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return fmt.Errorf("controlplane: metrics: %w", err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	procedures := map[string]bool{}
	for p := range Policy() {
		procedures[p] = true
	}
	obs, err := newObserver(provider.Meter("github.com/tetherhq/tether/controlplane"), s.log, procedures)
	if err != nil {
		return err
	}
	s.metrics.register(registry)
	obs.streams = s.metrics.streams
	authn := &auth.Interceptor{
		Issuer:             s.issuer,
		Policy:             Policy(),
		Now:                s.cfg.Clock.Now,
		AgentActive:        s.agentActive,
		Revoked:            s.tokenRevoked,
		RevocationsChanged: s.grants.RevocationsChanged,
		AgentEnded:         s.agentEnded,
		Limiter:            &auth.RateLimiter{Rate: s.cfg.RateLimit, Burst: max(s.cfg.RateBurst, 2*s.cfg.RateLimit), Now: s.cfg.Clock.Now},
		Evidence: map[string]bool{
			tetherv1connect.ToolServiceEndCallProcedure:   true,
			tetherv1connect.ToolServiceCancelAckProcedure: true,
		},
		Relayed: map[string]bool{
			tetherv1connect.ToolServiceBeginCallProcedure: true,
			tetherv1connect.LeaseServiceGetLeaseProcedure: true,
		},
		Upkeep: map[string]bool{
			tetherv1connect.AgentServiceSessionProcedure:     true,
			tetherv1connect.AgentServiceHeartbeatProcedure:   true,
			tetherv1connect.AgentServiceConfirmExitProcedure: true,
			tetherv1connect.ToolServiceEndCallProcedure:      true,
			tetherv1connect.ToolServiceCancelAckProcedure:    true,
			tetherv1connect.LeaseServiceAckProcedure:         true,
			tetherv1connect.LeaseServiceRenewProcedure:       true,
			tetherv1connect.LeaseServiceCancelAckProcedure:   true,
			tetherv1connect.LeaseServiceCompleteProcedure:    true,
			tetherv1connect.LeaseServiceChannelProcedure:     true,
		},
		Reserve: &auth.RateLimiter{Rate: UpkeepReserveRate, Burst: UpkeepReserveBurst, Now: s.cfg.Clock.Now},
		// A worker message naming a lease its sender holds is admitted from
		// that lease's allowance once the lineage's budget is spent
		// (lease_allowance.go); one that turns out not to bounds the node's
		// further calls admitted owing to the rate of its reserve.
		Held: map[string]bool{
			tetherv1connect.LeaseServiceAckProcedure:       true,
			tetherv1connect.LeaseServiceRenewProcedure:     true,
			tetherv1connect.LeaseServiceProgressProcedure:  true,
			tetherv1connect.LeaseServiceCancelAckProcedure: true,
			tetherv1connect.LeaseServiceCompleteProcedure:  true,
			tetherv1connect.LeaseServiceChannelProcedure:   true,
		},
		Holds:      (&leaseService{s: s}).holds,
		Owing:      &auth.RateLimiter{Rate: UpkeepReserveRate, Burst: UpkeepReserveBurst, Now: s.cfg.Clock.Now},
		Anonymous:  &auth.RateLimiter{Rate: s.cfg.AnonymousRateLimit, Burst: 2 * s.cfg.AnonymousRateLimit, Now: s.cfg.Clock.Now},
		MaxStreams: s.cfg.Conn.MaxStreamsPerCaller,
		// A lineage's streams together; each node's own reserves past
		// them (signal streams, and a few of other kinds).
		MaxLineageStreams: s.cfg.Conn.MaxStreamsPerLineage,
		Signals: map[string]bool{
			tetherv1connect.AgentServiceSessionProcedure:      true,
			tetherv1connect.AgentServiceWatchSignalsProcedure: true,
		},
		SignalReserve: SignalStreamReserve,
		StreamReserve: StreamReserve,
		BodyReserve:   BodyReserve,
		AfterFuncAt: func(at time.Time, f func()) func() bool {
			return clock.AfterFuncAt(s.cfg.Clock, at, f).Stop
		},
		// A request's body past its first few KiB costs more of the
		// budget, charged before it is decoded; so does each message of
		// a client stream, whose messages are also charged one by one.
		BodyBytesPerRequest: BodyBytesPerRequest,
		MaxBodyBytes:        s.cfg.MaxRequestBytes,
		// So does an answer past its first AnswerBytesPerRequest bytes,
		// beyond what the call paid for its work.
		AnswerBytesPerRequest: AnswerBytesPerRequest,
		MessagesCharged:       clientStreamingProcedures(),
		Bind:                  bindConn,
		BoundBudget:           boundBudget,
		// A follower's connection carries every caller's forwarded
		// job-lease calls: a lineage at its share is refused alone,
		// and the connection kept (rogue43m test).
		SharedConn:  func(h http.Header) bool { return h.Get(forwardedHeader) != "" },
		Cache:       auth.NewTokenCache(0),
		RateLimited: s.metrics.rateLimitedCall,
	}
	// Refused at the Gate, before the observer interceptor: a path that is
	// not a procedure (the caller's choice) is counted as UnknownProcedure.
	procedures[UnknownProcedure] = true
	authn.Refused = func(ctx context.Context, path string, start time.Time, err error) {
		if !procedures[path] {
			path = UnknownProcedure
		}
		obs.record(ctx, path, start, err)
	}
	s.authn = authn
	opts := []connect.HandlerOption{
		connect.WithInterceptors(obs, authn),
		boundedMessages(s.cfg.MaxRequestBytes),
		recoverPanic(s.log),
	}
	mux := http.NewServeMux()
	s.mountServices(mux, opts)
	// Check only: the statuses never change, so Watch would be Check held
	// open, free (rogue48g test).
	checker := checkOnly{grpchealth.NewStaticChecker(serviceNames()...)}
	mux.Handle(grpchealth.NewHandler(checker, connect.WithInterceptors(obs), publicMessages(s.cfg.MaxRequestBytes)))
	s.mountReflection(mux, obs)
	mux.HandleFunc("GET /healthz", s.healthz)
	// A scrape gathers and encodes every series (milliseconds of CPU): it
	// costs the caller's address a request of the anonymous budget.
	mux.Handle("GET /metrics", authn.PublicHTTP(promhttp.HandlerFor(registry, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET /.well-known/jwks.json", s.jwks)
	// The operator console (controlplane/console) on its own route: it
	// calls the API in process through s.handler, as any client would.
	ui, err := console.New(console.Config{API: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }), Now: s.cfg.Clock.Now, Log: s.log})
	if err != nil {
		return err
	}
	mux.Handle("/ui/", ui)
	// Outermost first: the request's goroutine gets its stack at once;
	// every request gets its deadlines; a health-only connection answers
	// only /healthz; RPCs are authenticated from their headers before
	// their body is read; an admitted unary call's answer takes a slot of
	// its caller's while it is written; an admitted request's body is
	// bounded by the message limit; an admitted stream loses its deadlines.
	//
	// Run's http.Server sets the deadlines itself (ReadTimeout and
	// WriteTimeout: on HTTP/2, per stream, when the serving goroutine opens
	// it), so what it serves skips withDeadlines, whose two
	// ResponseController calls are two messages to that goroutine per
	// request; Handler, for any other server, keeps them.
	inner := preAuthBounded(authn.Guards, healthOnly(s.cfg.Conn.MaxConnections, authn.Gate(admittedRequests(answersBounded(authn.TakeAnswer, boundBodies(s.cfg.MaxRequestBytes, streamsUnbounded(s.cfg.Conn.WriteTimeout, mux)))))))
	s.served = withStack(inner)
	s.handler = withStack(withDeadlines(s.cfg.Conn, inner))
	return nil
}

func (s *Server) jwks(w http.ResponseWriter, _ *http.Request) {
	body, err := s.keys.Get().JWKS()
	if err != nil {
		http.Error(w, "jwks unavailable", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=60")
	_, _ = w.Write(body)
}

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	limits := s.cfg.Conn
	srv := &http.Server{
		Handler: s.served,
		// Every request's read and write deadlines, from its start (on
		// HTTP/1.1, the connection's while it is read and answered; on
		// HTTP/2, its stream's), lifted for authenticated streams
		// (streamsUnbounded), which would otherwise be cut.
		ReadTimeout:       limits.ReadTimeout,
		WriteTimeout:      limits.WriteTimeout,
		ReadHeaderTimeout: limits.ReadHeaderTimeout,
		MaxHeaderBytes:    limits.MaxHeaderBytes,
		IdleTimeout:       limits.IdleTimeout,
		ConnContext:       connContext,
		ErrorLog:          httpErrorLog(s.log),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: limits.MaxStreamsPerConn,
			SendPingTimeout:      limits.PingInterval,
			PingTimeout:          limits.PingTimeout,
			// A connection whose peer takes none of its bytes this long is
			// closed: a peer that reads nothing, yet sends a frame now and
			// then (so it is never pinged), held the connection for ever —
			// the GOAWAY of its idle timeout waiting behind the stuck write
			// — with megabytes of the kernel's send buffer pinned.
			WriteByteTimeout: limits.WriteTimeout,
			// Frames of 16 KiB: a frame's header made the server allocate
			// the megabyte it declared (MaxFrameBytes).
			MaxReadFrameSize: MaxFrameBytes,
			// Request bodies read ahead of their handlers: 64 KiB a
			// connection, where Go's default, a megabyte, let a client
			// park a megabyte of body a connection behind a refusal it
			// does not take (MaxReceiveBufferBytes).
			MaxReceiveBufferPerConnection: MaxReceiveBufferBytes,
			MaxReceiveBufferPerStream:     MaxReceiveBufferBytes,
		},
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	if s.cfg.TLSCert != "" {
		tlsConfig, err := s.cfg.serverTLS()
		if err != nil {
			return err
		}
		srv.TLSConfig = tlsConfig
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	srv.Protocols = protocols
	// Each HTTP/2 connection's frames pass a frameGuard: the server reads
	// at most MaxFramesAhead of a peer's frames ahead of its writer.
	frames := frameLimits{burst: max(limits.ControlFrames, 0), rate: limits.ControlFrameRate, clock: s.cfg.Clock, throttled: &s.throttled, byteTimeout: limits.WriteTimeout}
	if err := guardHTTP2(srv, frames); err != nil {
		return err
	}
	conns := &connLimiter{
		Listener: ln, max: limits.MaxConnections, reserve: limits.HealthReserve,
		perCaller: limits.MaxConnectionsPerLineage, operatorReserve: limits.OperatorReserve,
		preAuth: limits.PreAuthTimeout, grace: limits.WriteTimeout, idle: limits.IdleTimeout,
		drain:     max(limits.ReadTimeout, limits.WriteTimeout) + 2*limits.IdleTimeout,
		plaintext: srv.TLSConfig == nil,
	}
	srv.ConnState = func(c net.Conn, state http.ConnState) {
		s.metrics.connState(c, state)
		conns.connState(c, state)
	}
	s.conns.Store(conns)
	ln = conns
	// The background components (reconcilers, expiry scanners, feeds) run
	// beside the HTTP server; the first to stop stops everything.
	ctx, cancelComponents := context.WithCancel(ctx)
	defer cancelComponents()
	components := s.runnableComponents()
	componentErr := make(chan error, len(components))
	// failed is the first component that stopped on its own with an error
	// (the lease coordinator finding a corrupt record, say): Run returns
	// it, so that `tether serve` exits with it.
	var failedMu sync.Mutex
	var failed error
	for _, c := range components {
		go func() {
			err := c.run(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Error("component stopped", "component", c.name, "error", err)
				failedMu.Lock()
				if failed == nil {
					failed = fmt.Errorf("controlplane: component %s: %w", c.name, err)
				}
				failedMu.Unlock()
			}
			componentErr <- err
			cancelComponents()
		}()
	}
	defer func() {
		cancelComponents()
		for range components {
			<-componentErr
		}
	}()
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(ln, "", "") // ServeTLS adds h2 to ALPN
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	<-errc
	failedMu.Lock()
	defer failedMu.Unlock()
	if failed != nil {
		return failed
	}
	return err
}

// Close releases the store (when the server opened it).
func (s *Server) Close() error {
	s.active.close()
	if s.ownStore && s.store != nil {
		return s.store.Close()
	}
	return nil
}

// component is a long-lived part of the server with Run semantics.
type component struct {
	name string
	run  func(ctx context.Context) error
	// leaderOnly components run only while this replica leads (see
	// leadership.go).
	leaderOnly bool
}

func (s *Server) addComponent(name string, run func(ctx context.Context) error) {
	s.components = append(s.components, component{name: name, run: run})
}

// addLeaderComponent registers a component that must run once per cluster:
// it runs while this replica is the elected leader, is cancelled when
// leadership is lost, and runs again when it is regained — so it must be
// restartable and rebuild its memory from the store.
func (s *Server) addLeaderComponent(name string, run func(ctx context.Context) error) {
	s.components = append(s.components, component{name: name, run: run, leaderOnly: true})
}

func serviceNames() []string {
	return []string{
		tetherv1connect.AgentServiceName, tetherv1connect.AuthServiceName,
		tetherv1connect.CapabilityServiceName, tetherv1connect.ToolServiceName,
		tetherv1connect.SupervisorServiceName, tetherv1connect.LeaseServiceName,
		tetherv1connect.StopRuleServiceName,
	}
}

// UpkeepReserveRate and UpkeepReserveBurst size each agent node's own
// reserve for its upkeep (auth.Interceptor.Upkeep): what its session, its
// leases, its gate and its exit need once another member of its lineage
// has spent the budget the lineage shares. A heartbeat every 5 s and a
// renewal a third of a lease's life fit it many times over; a rogue's
// children each bring a reserve only for their own upkeep, and each was a
// spawn its lineage paid for.
const (
	UpkeepReserveRate  = 2
	UpkeepReserveBurst = 16
)

// LeaseUpkeepAllowance is how many upkeep messages (ACK, renewals,
// progress reports, cancel acknowledgement, completion) about a lease its
// holder may have admitted per lease duration (at least a second) once
// its lineage's budget is spent, without touching its node's reserve
// (lease_allowance.go): a renewal every third of the lease, a progress
// report as often, an ACK and an end fit it.
const LeaseUpkeepAllowance = 10

// LeaseUpkeepNodeRate and LeaseUpkeepNodeBurst bound what one node has
// admitted from its leases' allowances (LeaseUpkeepAllowance): the
// upkeep of about five hundred leases renewed every 10 s, however many
// leases its lineage piles up on it.
const (
	LeaseUpkeepNodeRate  = 50
	LeaseUpkeepNodeBurst = 500
)

// BodyReserve is how many calls admitted from their headers whose request
// bodies have not all arrived each agent node may have beyond its
// lineage's share of them (ConnLimits.MaxStreamsPerLineage, counted apart
// from streams; auth.Interceptor.BodyReserve), taken first: a call's
// handler waits for its body until --read-timeout, and a member of the
// lineage holding the share with bodies it never sends cannot keep a
// sibling's calls from being served. A rogue's children each bring four,
// and each was a spawn its lineage paid for. It is, too, how many answers
// of its admitted unary calls being written each node may have beyond its
// lineage's share of those (answersBounded), counted apart again.
const BodyReserve = 4

// peerLines are the beginnings of the lines net/http's servers write to
// their error log for what a peer did to its own connection: a TLS
// handshake it failed, a preface or SETTINGS it did not send, a PING it
// did not answer, a protocol error, a GOAWAY with an error code. Anyone
// who can reach the port writes them, without a credential, and the last
// once a frame: a GOAWAY of 17 bytes, a hundred and more on a connection
// (its frame budget's burst) before it closes (rogue45g test
// TestRogue45GBAPeersFramesDoNotWriteTheServersWarnings).
var peerLines = []string{
	"http: TLS handshake error from ",
	"http2: server: error reading preface from client ",
	"timeout waiting for SETTINGS frames from ",
	"timeout waiting for PING response",
	"http2: server connection error from ",
	"http2: received GOAWAY ",
}

// httpErrorLog is the error log of the API's http.Server: what a peer did
// to its own connection (peerLines) is logged at debug level, as the
// observer logs a refusal; the rest — the server's own faults (a panic
// serving, an answer's headers written twice, an Accept failing) — as a
// warning.
func httpErrorLog(l *slog.Logger) *log.Logger {
	return log.New(httpErrorWriter{l}, "", 0)
}

type httpErrorWriter struct{ l *slog.Logger }

func (w httpErrorWriter) Write(p []byte) (int, error) {
	line := strings.TrimSuffix(string(p), "\n")
	level := slog.LevelWarn
	for _, prefix := range peerLines {
		if strings.HasPrefix(line, prefix) {
			level = slog.LevelDebug
			break
		}
	}
	w.l.Log(context.Background(), level, line)
	return len(p), nil
}
