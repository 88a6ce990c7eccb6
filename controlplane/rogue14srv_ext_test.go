package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fourteenth rogue pass, against the server's surfaces other than the
// two state machines (connections, public endpoints, the console, stop
// rules). Each test plays one rogue through the real server (Badger on
// disk, real HTTP, real JWTs, the manual clock).

// rpcMethods are the values of rpc_method in one read of /metrics.
func rpcMethods(t *testing.T, srv *testserver.Server) map[string]bool {
	t.Helper()
	methods := map[string]bool{}
	for _, f := range scrapeMetrics(t, srv.HTTP, srv.URL) {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "rpc_method" {
					methods[l.GetValue()] = true
				}
			}
		}
	}
	return methods
}

// A rogue cannot fill the server's metrics with names of its choosing. Each
// refused call was counted under the path it was sent to, and anyone may
// send a call to any path under a tether service: with no credential at
// all (refused unauthenticated) or with its own (refused unimplemented),
// each new path became a new series of rpc.server.requests and of the
// rpc.server.duration histogram. The metrics SDK keeps 2000 attribute sets
// per instrument and folds any later one into a single overflow series, so
// a rogue (2000 requests: minutes at the anonymous rate of one address)
// blinded the operators' per-procedure counts for every procedure and code
// first seen afterwards, and every scrape carried its thousands of series.
// A path that is not a procedure is now counted under one name.
func TestARogueCannotFillTheMetricsWithPathsOfItsChoosing(t *testing.T) {
	srv := testserver.Start(t)
	agent := register(t, srv.AdminClients(), "rogue")
	for i := range 40 {
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/tether.v1.AgentService/Rogue%d", srv.URL, i), strings.NewReader(""))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/proto")
		if i%2 == 1 {
			req.Header.Set("Authorization", "Bearer "+agent.Credential)
		}
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{false: http.StatusUnauthorized, true: http.StatusNotImplemented}[i%2 == 1]; resp.StatusCode != want {
			t.Fatalf("the rogue's call %d to a made-up path: status %d, want %d", i, resp.StatusCode, want)
		}
	}
	register(t, srv.AdminClients(), "operators-agent")
	methods := rpcMethods(t, srv)
	policy := controlplane.Policy()
	for m := range methods {
		if _, ok := policy[m]; !ok && m != controlplane.UnknownProcedure {
			t.Errorf("/metrics has a series under the rogue's path %q", m)
		}
	}
	for _, m := range []string{"/tether.v1.AgentService/RegisterRoot", controlplane.UnknownProcedure} {
		if !methods[m] {
			t.Errorf("/metrics has no series for %s: %v", m, methods)
		}
	}
}

// A rogue cannot have the server answer reflection for free. Reflection is
// public (grpcurl lists the services without a token) and a bidirectional
// stream: every request on it had the server look up and serialise the
// descriptors asked for, tens of kilobytes each, while the anonymous rate
// budget of the caller's address — which bounds every other request that
// carries no valid credential — was never asked. One stream, and as many
// as the connection limits allow, answered for as fast as the rogue could
// send. Each reflection request now costs one request of that budget: past
// it the stream ends resource-exhausted, and a caller with a credential
// the server knows goes on.
func TestARogueCannotFloodReflectionWithoutACredential(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 1 })
	register(t, srv.AdminClients(), "operators-agent") // the operator's token is verified (and known) before
	stream := grpcreflect.NewClient(srv.HTTP, srv.URL).NewStream(context.Background())
	defer stream.Close()
	answered := 0
	var err error
	for range 50 {
		if _, err = stream.FileContainingSymbol("tether.v1.AgentService"); err != nil {
			break
		}
		answered++
	}
	if answered > 2 || connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's reflection stream had %d of 50 requests answered (the anonymous burst is 2), ended %v; want the rest refused resource-exhausted", answered, err)
	}
	if !strings.Contains(err.Error(), "rate limit for requests without a valid credential") {
		t.Errorf("the refusal does not say which budget: %v", err)
	}
	register(t, srv.AdminClients(), "operators-second-agent")
}

// A rogue without a credential cannot hold the server's public streams
// open for ever: a reflection stream it never writes to again is not
// authenticated, so it does not lift the request's deadlines, and the
// connection carrying it never authenticates: it ends, the connection is
// closed, and only the operator's connection is left. The health
// service's Watch (which answered once and then waited for a change that,
// with a static checker, never comes) is answered unimplemented at once
// since the forty-eighth pass (rogue48g test).
func TestARoguesPublicStreamsDoNotOutliveItsUnauthenticatedConnection(t *testing.T) {
	srv := testserver.Start(t, preAuthLimits)
	op := newOwnConn(t, srv, srv.Admin)
	if err := whoAmI(op.Clients); err != nil {
		t.Fatal(err)
	}
	rogue := newOwnConn(t, srv, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := grpchealth.NewClient(rogue.hc, srv.URL).Watch(ctx, &grpchealth.CheckRequest{})
	if ev := <-watch; connect.CodeOf(ev.Err) != connect.CodeUnimplemented {
		t.Fatalf("the rogue's health watch: %+v, want unimplemented at once", ev)
	}
	reflect := grpcreflect.NewClient(rogue.hc, srv.URL).NewStream(ctx)
	defer reflect.Close()
	if _, err := reflect.ListServices(); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "only the operator's connection to be left", func() bool { return srv.OpenConnections() == 1 })
	if _, err := reflect.ListServices(); err == nil {
		t.Error("the rogue's reflection stream still answers after its connection's pre-authentication time")
	}
	if err := whoAmI(op.Clients); err != nil {
		t.Fatal(err)
	}
}

// A rogue cannot spend the server's CPU through /metrics. The endpoint is
// public (Prometheus scrapes it without a token) and a scrape gathers and
// encodes every series — about 1.9 ms of CPU here, against about 0.1 ms
// for a request refused for its credential — so a caller with no
// credential asking for it in a loop kept a core busy, on every
// connection it opened, while every other public request or refusal
// without a credential was bounded per source address. A scrape now costs
// one request of that budget: past it the answer is 429 with Retry-After,
// and the budget refills with time (a scraper asks every few seconds).
func TestARogueCannotSpendTheServersCPUThroughMetrics(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 1 })
	get := func() *http.Response {
		resp, err := srv.HTTP.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := range 2 { // the burst
		if resp := get(); resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape %d: %s", i+1, resp.Status)
		}
	}
	for i := range 20 {
		if resp := get(); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("the rogue's scrape %d past the budget: %s, Retry-After %q; want 429 with Retry-After", i+3, resp.Status, resp.Header.Get("Retry-After"))
		}
	}
	clk.Advance(time.Second)
	if resp := get(); resp.StatusCode != http.StatusOK {
		t.Fatalf("a scrape a second later: %s", resp.Status)
	}
	for _, path := range []string{"/healthz", "/.well-known/jwks.json"} {
		if resp, err := srv.HTTP.Get(srv.URL + path); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s with the address's budget spent: %v %v", path, resp, err)
		} else {
			resp.Body.Close()
		}
	}
}

// A rogue agent's refused requests are not free. Its lineage's rate budget
// was spent only once a request had passed the policy: a call to a path
// that is no procedure (unimplemented) or to one agents may not call
// (permission denied, here CreateToken) was refused without costing it
// anything, so an agent could keep the server authenticating and refusing
// for as fast as it could send — while the same requests without a
// credential are bounded per address. Each now costs a request of the
// caller's budget: past it, the refusal is resource-exhausted, naming the
// lineage.
func TestARogueAgentsRefusedRequestsSpendItsLineagesBudget(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit = 1 })
	agent := register(t, srv.AdminClients(), "rogue")
	rogue := srv.Clients(agent.Credential)
	for _, probe := range []struct {
		what string
		call func() error
		code connect.Code
	}{
		{"a made-up procedure", func() error {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/tether.v1.AgentService/Nope", strings.NewReader(""))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/proto")
			req.Header.Set("Authorization", "Bearer "+agent.Credential)
			resp, err := srv.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return connect.NewError(map[int]connect.Code{http.StatusNotImplemented: connect.CodeUnimplemented, http.StatusTooManyRequests: connect.CodeResourceExhausted}[resp.StatusCode], fmt.Errorf("%s", resp.Status))
		}, connect.CodeUnimplemented},
		{"an operator's procedure", func() error {
			_, err := rogue.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_ADMIN}))
			return err
		}, connect.CodePermissionDenied},
	} {
		clk.Advance(3 * time.Second) // a full budget again: burst 2
		var err error
		for i := range 2 {
			if err = probe.call(); connect.CodeOf(err) != probe.code {
				t.Fatalf("%s, call %d within the budget: %v", probe.what, i+1, err)
			}
		}
		refused := 0
		for range 20 {
			if err = probe.call(); connect.CodeOf(err) == connect.CodeResourceExhausted {
				refused++
			}
		}
		if refused != 20 {
			t.Errorf("%s: %d of the 20 calls past the budget were refused resource-exhausted; the rest cost the rogue nothing (last: %v)", probe.what, refused, err)
		}
	}
}
