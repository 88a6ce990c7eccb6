package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// scrape is one read of /metrics.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, hc *http.Client, url string) scrape {
	t.Helper()
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return families
}

// value sums the series of name whose labels include want: a counter's or
// gauge's value, a histogram's sample count. ok is false when name has no
// such series at all.
func (s scrape) value(name string, want map[string]string) (float64, bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
	total, found := 0.0, false
series:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue series
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total, found
}

func (s scrape) histogramSum(name string) float64 {
	total := 0.0
	if f := s[name]; f != nil {
		for _, m := range f.Metric {
			total += m.GetHistogram().GetSampleSum()
		}
	}
	return total
}

// metricWant is one domain metric and a test of its value.
type metricWant struct {
	name   string
	labels map[string]string
	ok     func(v float64) bool
	want   string
}

func eq(n float64) (func(float64) bool, string) {
	return func(v float64) bool { return v == n }, fmt.Sprintf("= %g", n)
}
func atLeast(n float64) (func(float64) bool, string) {
	return func(v float64) bool { return v >= n }, fmt.Sprintf(">= %g", n)
}

func expect(name string, labels map[string]string, test func(float64) (func(float64) bool, string), n float64) metricWant {
	ok, want := test(n)
	return metricWant{name: name, labels: labels, ok: ok, want: want}
}

func (s scrape) unmet(exps []metricWant) []string {
	var out []string
	for _, e := range exps {
		v, found := s.value(e.name, e.labels)
		if !found || !e.ok(v) {
			out = append(out, fmt.Sprintf("%s%v = %g (found %t), want %s", e.name, e.labels, v, found, e.want))
		}
	}
	sort.Strings(out)
	return out
}

// TestMetricsAfterATerminationAndALeaseStorm drives a real server through a
// storm of job-lease messages (accepted, duplicate, rejected, expired), a
// revocation and an abort whose agent never confirms its exit, with a
// revocation follower connected, then reads /metrics as Prometheus would and
// finds every domain metric with the values that history implies.
func TestMetricsAfterATerminationAndALeaseStorm(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()

	// A follower of the revocation feed, open while /metrics is read.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	follower, err := w.admin.Capability.WatchRevocations(streamCtx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !follower.Receive() {
		t.Fatalf("revocation feed: %v", follower.Err())
	}

	// The storm: 40 jobs offered to w1, acknowledged and renewed, each
	// renewal sent twice, then one for a generation not yet offered; half complete, the other
	// half are left to expire.
	const jobs = 40
	var open []*tetherv1.Lease
	for i := range jobs {
		l := w.offer(t, w.job(), w.w1, 30*time.Second)
		l, _ = unary{w.w1C}.send(t, ack(l))
		unary{w.w1C}.send(t, renew(l, 1))
		unary{w.w1C}.send(t, renew(l, 1))
		future := renew(l, 2)
		future.GetRenew().LeaseGeneration++
		if _, d := (unary{w.w1C}).send(t, future); d.Outcome != tetherv1.Outcome_OUTCOME_REJECTED {
			t.Fatalf("a renewal of a future generation was %s", d.Outcome)
		}
		if i%2 == 0 {
			unary{w.w1C}.send(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))
		} else {
			open = append(open, l)
		}
	}

	// Grants: one revoked by the operator, one held by the agent about to
	// be terminated (revoked by its termination), one left active, one
	// that expires.
	revoked := issueRoot(t, w.admin, w.planner, time.Hour, "tool:*")
	if _, err := revokeGrant(w.admin, revoked.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	issueRoot(t, w.admin, w.stranger, time.Hour, "tool:*")
	issueRoot(t, w.admin, w.w1, time.Hour, "tool:*")
	issueRoot(t, w.admin, w.w2, 10*time.Second, "tool:*") // expires when the clock moves on

	// A termination whose agent never confirms: unaccounted in the record.
	term := terminate(t, w.admin, w.stranger, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, 10*time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clock.Advance(31 * time.Second) // past the confirm timeout and the open leases' expiry
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	feed := "/tether.v1.CapabilityService/WatchRevocations"
	exps := []metricWant{
		expect("tether_supervisor_agents", map[string]string{"state": "running"}, eq, 3),
		expect("tether_supervisor_agents", map[string]string{"state": "terminated"}, eq, 1),
		expect("tether_supervisor_agents", map[string]string{"state": "draining"}, eq, 0),
		expect("tether_supervisor_terminations", map[string]string{"state": "terminated"}, eq, 1),
		expect("tether_supervisor_terminations", map[string]string{"state": "requested"}, eq, 0),
		expect("tether_supervisor_termination_duration_seconds", map[string]string{"mode": "abort"}, eq, 1),
		expect("tether_supervisor_unaccounted_agents_total", nil, eq, 1),
		expect("tether_capability_grants", map[string]string{"state": "active"}, eq, 1),
		expect("tether_capability_grants", map[string]string{"state": "revoked"}, eq, 2),
		expect("tether_capability_grants", map[string]string{"state": "expired"}, eq, 1),
		expect("tether_capability_revocations_total", nil, eq, 2),
		expect("tether_capability_revocation_feed_lag_sequences", nil, eq, 0),
		expect("tether_capability_revocation_feed_lag_seconds", nil, eq, 0),
		expect("tether_capability_revocation_publish_delay_seconds", nil, eq, 2),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "accepted", "event": "offered"}, eq, jobs),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "accepted", "event": "acked"}, eq, jobs),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "accepted", "event": "renewed"}, eq, jobs),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "duplicate", "event": "duplicate_renew"}, eq, jobs),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "rejected", "event": "future_generation"}, eq, jobs),
		expect("tether_lease_decisions_total", map[string]string{"outcome": "accepted", "event": "terminal_accepted"}, eq, jobs/2),
		expect("tether_lease_decisions_total", map[string]string{"event": "lease_expired"}, eq, float64(len(open))),
		expect("tether_store_commit_duration_seconds", nil, atLeast, 1),
		expect("tether_store_commit_batch_updates", nil, atLeast, 1),
		expect("tether_server_open_connections", nil, atLeast, 1),
		expect("tether_server_connections_total", nil, atLeast, 1),
		expect("tether_server_open_streams", map[string]string{"procedure": feed}, eq, 1),
	}
	// The censuses follow the store asynchronously: wait for them, and
	// say what is still missing if they never get there.
	var last scrape
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		last = scrapeMetrics(t, w.srv.HTTP, w.srv.URL)
		unmet := last.unmet(exps)
		if len(unmet) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, /metrics still has:\n%s", strings.Join(unmet, "\n"))
		}
	}
	// Plausible, not only present: the abort waited out its 10s confirm
	// timeout on the manual clock; every commit answered at least one update.
	if sum := last.histogramSum("tether_supervisor_termination_duration_seconds"); sum < 10 || sum > 60 {
		t.Fatalf("termination took %gs, want the 10s confirm timeout and a little", sum)
	}
	commits, _ := last.value("tether_store_commit_batch_updates", nil)
	if updates := last.histogramSum("tether_store_commit_batch_updates"); updates < commits {
		t.Fatalf("%g updates in %g commits", updates, commits)
	}

	// docs/observability.md lists exactly the domain metrics served.
	doc, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(line, "| `tether_"); ok {
			documented = append(documented, "tether_"+rest[:strings.IndexByte(rest, '`')])
		}
	}
	var served []string
	for name := range last {
		if strings.HasPrefix(name, "tether_") {
			served = append(served, name)
		}
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("docs/observability.md lists\n  %v\n/metrics serves\n  %v", documented, served)
	}

	// The stream gauge falls back when the follower leaves.
	stopStream()
	testserver.WaitFor(t, 10*time.Second, "the follower's stream to close", func() bool {
		v, _ := scrapeMetrics(t, w.srv.HTTP, w.srv.URL).value("tether_server_open_streams", map[string]string{"procedure": feed})
		return v == 0
	})
}

// TestMetricsCountRateLimitRefusals: a caller over its rate is refused with
// ResourceExhausted and the refusal is counted, by procedure.
func TestMetricsCountRateLimitRefusals(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 2 })
	admin := srv.AdminClients()
	refused := 0
	for range 5 {
		_, err := admin.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if refused != 3 {
		t.Fatalf("%d of 5 calls refused with a burst of 2 on a frozen clock, want 3", refused)
	}
	got, _ := scrapeMetrics(t, srv.HTTP, srv.URL).value("tether_auth_rate_limited_requests_total", map[string]string{"procedure": "/tether.v1.AuthService/WhoAmI"})
	if got != 3 {
		t.Fatalf("tether_auth_rate_limited_requests_total = %g, want 3", got)
	}
}
