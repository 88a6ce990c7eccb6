package controlplane

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Store prefixes the censuses watch. They are the supervisor's and the
// grant store's key layouts (supervisor/keys.go, grantstore/keys.go),
// read, never written, from here.
const (
	nodePrefix        = "agents/node/"
	grantPrefix       = "grants/grant/"
	terminationPrefix = "terminations/"
)

// metrics are the domain metrics of one control plane, in Prometheus form
// (docs/observability.md lists them). Events are counted where they happen
// with pre-bound instruments (atomic adds); "by state" gauges come from
// censuses kept current by store watches (census.go); the rest is read
// from the owning component at scrape time (one or two key reads at most).
type metrics struct {
	connections      prometheus.Gauge
	connectionsTotal prometheus.Counter
	streams          *prometheus.GaugeVec
	rateLimited      *prometheus.CounterVec
	commitDuration   prometheus.Histogram
	commitBatch      prometheus.Histogram
	publishDelay     prometheus.Histogram
	terminationTime  *prometheus.HistogramVec
	unaccounted      prometheus.Counter

	agents, grants, terminations *census

	descAgents, descGrants, descTerminations *prometheus.Desc
	descDecisions, descRevocations           *prometheus.Desc
	descFeedLagSeq, descFeedLagSeconds       *prometheus.Desc

	s *Server
}

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s}
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tether_server_open_connections", Help: "Client connections open now (HTTP/1.1 and HTTP/2)."})
	m.connectionsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_server_connections_total", Help: "Client connections accepted."})
	m.streams = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tether_server_open_streams", Help: "Streaming RPCs in progress, by procedure (revocation followers, sessions, lease and termination watches)."},
		[]string{"procedure"})
	m.rateLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_auth_rate_limited_requests_total", Help: "Requests refused by the rate limiter (ResourceExhausted), by procedure."},
		[]string{"procedure"})
	m.commitDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tether_store_commit_duration_seconds", Help: "Time from taking a group of store updates to their being durable.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}})
	m.commitBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tether_store_commit_batch_updates", Help: "Store updates made durable by one commit (the group commit's batch size).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 13)})
	m.publishDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tether_capability_revocation_publish_delay_seconds", Help: "Time from a revocation's commit time to its tombstone being served by this replica's feed.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30}})
	m.terminationTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tether_supervisor_termination_duration_seconds", Help: "Time from a termination's request to its record, by mode (drain or abort).",
		Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600}},
		[]string{"mode"})
	m.unaccounted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_supervisor_unaccounted_agents_total", Help: "Agents that terminations recorded as unaccounted (no exit confirmed by the deadline)."})

	m.descAgents = prometheus.NewDesc("tether_supervisor_agents", "Agents (tree nodes) stored, by state.", []string{"state"}, nil)
	m.descGrants = prometheus.NewDesc("tether_capability_grants", "Capability grants stored, by state (an active grant whose time has passed counts as expired).", []string{"state"}, nil)
	m.descTerminations = prometheus.NewDesc("tether_supervisor_terminations", "Terminations stored, by state.", []string{"state"}, nil)
	m.descDecisions = prometheus.NewDesc("tether_lease_decisions_total", "Durable job-lease decisions by outcome and audit event (on the replica that leads).", []string{"outcome", "event"}, nil)
	m.descRevocations = prometheus.NewDesc("tether_capability_revocations_total", "Tombstones ever written to the revocation feed (its head sequence).", nil, nil)
	m.descFeedLagSeq = prometheus.NewDesc("tether_capability_revocation_feed_lag_sequences", "Tombstones committed but not yet served by this replica's revocation feed.", nil, nil)
	m.descFeedLagSeconds = prometheus.NewDesc("tether_capability_revocation_feed_lag_seconds", "Age of the oldest tombstone committed but not yet served by this replica's feed (0 when none waits).", nil, nil)

	now := s.cfg.Clock.Now
	m.agents = &census{name: "agents", prefix: []byte(nodePrefix), classify: classifyNode, now: now,
		labels: []string{"running", "draining", "aborting", "terminated"}}
	m.grants = &census{name: "grants", prefix: []byte(grantPrefix), classify: classifyGrant, now: now,
		labels: []string{"active", "revoked", "expired"}, activeLabel: "active", expiredLabel: "expired"}
	m.terminations = &census{name: "terminations", prefix: []byte(terminationPrefix), classify: classifyTermination, now: now,
		labels: []string{"requested", "draining", "aborting", "reconciling", "terminated"}, changed: m.terminationChanged}
	return m
}

// register adds the metrics to registry and the censuses to the server's
// components (every replica runs them: each serves its own /metrics).
func (m *metrics) register(registry *prometheus.Registry) {
	registry.MustRegister(m.connections, m.connectionsTotal, m.streams, m.rateLimited, m.commitDuration,
		m.commitBatch, m.publishDelay, m.terminationTime, m.unaccounted, m)
	// Every procedure's refusal count exists from the start, at 0, so that
	// rate() sees the first refusal.
	for procedure := range Policy() {
		m.rateLimited.WithLabelValues(procedure)
	}
	for _, c := range []*census{m.agents, m.grants, m.terminations} {
		m.s.addComponent("metrics-"+c.name, func(ctx context.Context) error { return c.run(ctx, m.s.store, m.s.cfg.Clock, m.s.log) })
	}
	if o, ok := m.s.store.(interface{ ObserveCommits(store.CommitObserver) }); ok {
		o.ObserveCommits(m.committed)
	}
}

func (m *metrics) committed(c store.CommitStats) {
	m.commitDuration.Observe(c.Duration.Seconds())
	m.commitBatch.Observe(float64(c.Updates))
}

// published is the grant store's OnPublish.
func (m *metrics) published(t capability.Tombstone) {
	if !t.RevokedAt.IsZero() {
		m.publishDelay.Observe(max(0, m.s.cfg.Clock.Now().Sub(t.RevokedAt).Seconds()))
	}
}

// connState is the http.Server's ConnState hook.
func (m *metrics) connState(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		m.connections.Inc()
		m.connectionsTotal.Inc()
	case http.StateClosed, http.StateHijacked:
		m.connections.Dec()
	}
}

// terminationChanged observes a termination reaching its record.
func (m *metrics) terminationChanged(before censusEntry, had bool, after censusEntry, value []byte) {
	if after.label != "terminated" || (had && before.label == "terminated") {
		return
	}
	var t supervisor.Termination
	if err := json.Unmarshal(value, &t); err != nil {
		return
	}
	end := t.UpdatedAt
	for _, p := range t.Phases {
		if p.Phase == supervisor.PhaseTerminated {
			end = p.StartedAt
		}
	}
	if !t.RequestedAt.IsZero() && !end.Before(t.RequestedAt) {
		m.terminationTime.WithLabelValues(t.Mode.String()).Observe(end.Sub(t.RequestedAt).Seconds())
	}
	m.unaccounted.Add(float64(t.Progress.Unconfirmed))
}

// Describe implements prometheus.Collector for the metrics read at scrape
// time.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.descAgents, m.descGrants, m.descTerminations, m.descDecisions,
		m.descRevocations, m.descFeedLagSeq, m.descFeedLagSeconds} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, g := range []struct {
		desc *prometheus.Desc
		c    *census
	}{{m.descAgents, m.agents}, {m.descGrants, m.grants}, {m.descTerminations, m.terminations}} {
		counts, ok := g.c.snapshot()
		if !ok {
			continue
		}
		for label, n := range counts {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n), label)
		}
	}
	if m.s.leases != nil {
		for _, d := range m.s.leases.Decisions() {
			ch <- prometheus.MustNewConstMetric(m.descDecisions, prometheus.CounterValue, float64(d.Count),
				strings.ToLower(d.Outcome.String()), strings.ToLower(d.Event.String()))
		}
	}
	if m.s.grants != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if pos, err := m.s.grants.FeedPosition(ctx); err == nil {
			ch <- prometheus.MustNewConstMetric(m.descRevocations, prometheus.CounterValue, float64(pos.Stored))
			ch <- prometheus.MustNewConstMetric(m.descFeedLagSeq, prometheus.GaugeValue, float64(pos.Stored-pos.Served))
			lag := 0.0
			if !pos.OldestUnserved.IsZero() {
				lag = max(0, m.s.cfg.Clock.Now().Sub(pos.OldestUnserved).Seconds())
			}
			ch <- prometheus.MustNewConstMetric(m.descFeedLagSeconds, prometheus.GaugeValue, lag)
		}
	}
}

// classifyNode labels an agent by its state. Only the state field is
// needed; a node that does not decode is left out rather than failing the
// census.
func classifyNode(_, value []byte) (censusEntry, bool) {
	state, err := tree.StoredState(value)
	if err != nil {
		return censusEntry{}, false
	}
	return censusEntry{label: enumLabel(state.String(), "NODE_STATE_")}, true
}

func classifyGrant(_, value []byte) (censusEntry, bool) {
	var g tetherv1.Grant
	if err := proto.Unmarshal(value, &g); err != nil {
		return censusEntry{}, false
	}
	e := censusEntry{label: enumLabel(g.State.String(), "GRANT_STATE_")}
	if g.ExpiresAt != nil {
		e.expires = g.ExpiresAt.AsTime()
	}
	return e, true
}

func classifyTermination(_, value []byte) (censusEntry, bool) {
	var t struct {
		Phase supervisor.Phase `json:"phase"`
	}
	if err := json.Unmarshal(value, &t); err != nil {
		return censusEntry{}, false
	}
	return censusEntry{label: t.Phase.String()}, true
}

// enumLabel turns "NODE_STATE_RUNNING" into "running".
func enumLabel(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

// rateLimitedCall is the auth interceptor's RateLimited hook.
func (m *metrics) rateLimitedCall(procedure string) { m.rateLimited.WithLabelValues(procedure).Inc() }
