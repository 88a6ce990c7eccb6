package bench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/etcdtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func TestReportWritesJSONList(t *testing.T) {
	r := &Report{}
	r.Add("store/group-commit/writers=64", 43210.5, "ops/s")
	r.Add("store/group-commit-vs-baseline/writers=64", 5.25, "x")
	path := filepath.Join(t.TempDir(), "bench-results.json")
	if err := r.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("results are not a JSON list: %v\n%s", err, data)
	}
	want := []map[string]any{
		{"name": "store/group-commit/writers=64", "value": 43210.5, "unit": "ops/s"},
		{"name": "store/group-commit-vs-baseline/writers=64", "value": 5.25, "unit": "x"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d results, want %d", len(got), len(want))
	}
	for i := range want {
		for k, v := range want[i] {
			if got[i][k] != v {
				t.Errorf("result %d: %s = %v, want %v", i, k, got[i][k], v)
			}
		}
	}

	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := (&Report{}).WriteJSON(empty); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(empty); strings.TrimSpace(string(data)) != "[]" {
		t.Fatalf("an empty report wrote %q, want []", data)
	}
}

func TestReportTableIsAligned(t *testing.T) {
	r := &Report{}
	r.Add("a", 1234567, "ops/s")
	r.Add("much/longer/name", 5.5, "x")
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("table has %d lines, want header, rule and 2 rows:\n%s", len(lines), b.String())
	}
	// Values are right-aligned: their last digit sits in one column.
	end := strings.Index(lines[2], "1,234,567") + len("1,234,567")
	if got := strings.Index(lines[3], "5.50") + len("5.50"); got != end || end <= len("1,234,567") {
		t.Fatalf("values not aligned:\n%s", b.String())
	}
}

func TestRegisterAndRun(t *testing.T) {
	var ran []string
	Register("test/first", func(ctx context.Context, r *Report) error {
		ran = append(ran, "first")
		r.Add("test/first", 1, "x")
		return nil
	})
	errBroken := errors.New("broken")
	Register("test/second", func(context.Context, *Report) error {
		ran = append(ran, "second")
		return errBroken
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("registering a name twice did not panic")
			}
		}()
		Register("test/first", func(context.Context, *Report) error { return nil })
	}()

	r := &Report{}
	var log strings.Builder
	err := Run(t.Context(), r, func(name string) bool { return strings.HasPrefix(name, "test/") }, &log)
	if !errors.Is(err, errBroken) {
		t.Fatalf("Run returned %v, want the failing scenario's error", err)
	}
	if strings.Join(ran, ",") != "first,second" {
		t.Fatalf("ran %q, want both scenarios in name order despite the failure", ran)
	}
	if res := r.Results(); len(res) != 1 || res[0].Name != "test/first" {
		t.Fatalf("results %v", res)
	}
	if err := Run(t.Context(), r, func(string) bool { return false }, &log); err == nil {
		t.Fatal("Run with no matching scenario succeeded")
	}
}

func TestThroughput(t *testing.T) {
	rate, err := Throughput(t.Context(), 4, 50*time.Millisecond, func(ctx context.Context, _ int) error {
		select {
		case <-time.After(time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err() // ending with the run is not a failure
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// 4 workers each doing at most 1000 ops/s.
	if rate <= 0 || rate > 4000 {
		t.Fatalf("rate %.0f ops/s, want between 0 and 4000", rate)
	}

	errOp := errors.New("op failed")
	calls := 0
	_, err = Throughput(t.Context(), 1, time.Minute, func(context.Context, int) error {
		calls++
		if calls == 3 {
			return errOp
		}
		return nil
	})
	if !errors.Is(err, errOp) {
		t.Fatalf("Throughput returned %v, want the op's error without waiting out the run", err)
	}
}

// TestLargeSwarmSmall runs the million/ scenarios' steps on a swarm of 111
// agents, on Badger and on etcd: the tree and its grants are real (the
// record of the termination lists every agent, the revocation reaches a
// grandchild's token through the verifier), and every figure is reported.
func TestLargeSwarmSmall(t *testing.T) {
	for _, backend := range []string{"badger", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			r := &Report{Dir: t.TempDir(), StepTimeout: time.Minute}
			var srv *benchServer
			if backend == "etcd" {
				cluster := etcdtest.Start(t)
				s, stop, err := startEtcdServer(t.Context(), r, cluster)
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				srv = s
			} else {
				s, err := startServer(t.Context(), r, disableRateLimit)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Stop()
				srv = s
			}
			if err := largeSwarm(t.Context(), r, "small", srv, r.Dir, 0, 10, 10); err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, res := range r.Results() {
				got[res.Name] = true
			}
			for _, name := range []string{
				"small/build-agents-per-s", "small/heap-per-agent/agents=111", "small/rss-per-agent/agents=111",
				"small/revoke-to-verifier-reject/descendants=110", "small/revoke-rpc/descendants=110",
				"small/marker-background/descendants=110", "small/terminate-abort/agents=111",
			} {
				if !got[name] {
					t.Errorf("no result %s; have %v", name, r.Results())
				}
			}
		})
	}
}

func TestSummary(t *testing.T) {
	r := &Report{}
	r.Add("supervisor/terminate-abort/agents=1000", 100, "ms")
	r.Add("supervisor/terminate-abort/agents=10000", 1500, "ms")
	r.Add("supervisor/terminate-abort-cpu/agents=1000", 50, "ms")
	r.Add("supervisor/terminate-same-swarm/10k-over-1k", 9, "x")
	r.Add("supervisor/terminate-same-swarm-cpu/10k-over-1k", 8.5, "x")
	r.Add("supervisor/terminate-abort-cpu/agents=10000", 600, "ms")
	r.Add("server/etcd/terminate-abort/agents=1000", 300, "ms")
	r.Add("supervisor/terminate-beyond-one-txn/badger/terminate-abort/agents=120001", 9000, "ms")
	r.Add("supervisor/terminate-beyond-one-txn/etcd/terminate-abort/unfinished/agents=20001", 120000, "ms")
	r.Add("million/badger/terminate-abort/unfinished/agents=1000001", 900000, "ms")
	r.Add("lease/renew/unary/leases=1", 800, "renews/s")
	r.Add("lease/renew/etcd-txn/leases=1", 1000, "renews/s")
	r.Add("lease/renew/unary/leases=64", 3000, "renews/s")
	r.Add("lease/renew/etcd-txn/leases=64", 2000, "renews/s")
	r.Add("capability/revoke-to-verifier-reject/descendants=100000", 4.1, "ms")
	r.Add("lease/renew/stream/leases=1/p50", 0.5, "ms")
	r.Add("lease/renew/lone-floor-rpc/p50", 0.15, "ms")
	r.Add("lease/renew/lone-floor-fsync/p50", 0.1, "ms")
	r.Add("supervisor/spawn-durable-apart/rpc-floor/clients=64/server-cpu-per-call", 90, "µs")
	r.Add("supervisor/spawn-durable-apart/clients=64", 5000, "agents/s")
	r.Add("supervisor/spawn-durable-apart/clients=64/server-cpu-per-call", 180, "µs")
	rows := map[string]string{}
	for _, row := range Summary(r.Results()) {
		rows[row.Figure] = row.Value
	}
	for figure, want := range map[string]string{
		"terminate (abort) 10,000 agents, Badger":    "1,500 ms; 10k ÷ 1k: 15.00× wall, 12.00× CPU",
		"the same, both in an 11,000-agent swarm":    "10k ÷ 1k: 9.00× wall, 8.50× CPU",
		"terminate 1,000 agents, etcd vs Badger":     notMeasured, // no ratio in the results
		"unary renew ÷ etcd fenced renew, by leases": "1: 0.80× (800 vs 1,000/s); 64: 1.50×",
		"largest subtree one termination covered":    "Badger 120,001 (9,000 ms); 1,000,001 unfinished after 900.0 s; etcd 1,000 (300 ms); 20,001 unfinished after 120.0 s",
		"revoke → offline verifier rejects":          "100k 4.10 ms (1M: -million)",
		"spawn + credential, durable, 64 clients":    notMeasured,
		"the same, clients in another process":       "5,000 agents/s (server 180 µs a spawn, 90 µs a GetNode)",
		"closed-loop stream renew, 1 lease, p50":     "0.50 ms = floor 0.25 ms (RPC 0.15 ms + fsync 0.10 ms) +0.25 ms",
		"floors, p50":                                "fsync 0.10 ms, RPC 0.15 ms",
	} {
		if got, ok := rows[figure]; !ok || got != want {
			t.Errorf("%s: got %q, want %q", figure, got, want)
		}
	}
	var b strings.Builder
	if err := WriteSummary(&b, r.Results()); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != len(rows)+2 || !strings.HasPrefix(lines[0], "| figure") {
		t.Fatalf("summary table:\n%s", b.String())
	}
}

// The unary row quotes lease/renew's ratio of both passes (each system
// measured twice, the second time in the reverse order) where the results
// have it, not the ratio of the first pass's rates; results from before
// the second pass keep the rates' ratio.
func TestSummaryUnaryRenewBothPasses(t *testing.T) {
	r := &Report{}
	r.Add("lease/renew/unary/leases=1", 800, "renews/s")
	r.Add("lease/renew/etcd-txn/leases=1", 1000, "renews/s")
	r.Add("lease/renew/unary-vs-etcd/leases=1/first-pass", 0.8, "x")
	r.Add("lease/renew/unary-vs-etcd/leases=1", 0.7, "x")
	r.Add("lease/renew/unary/leases=8", 3000, "renews/s")
	r.Add("lease/renew/etcd-txn/leases=8", 2000, "renews/s")
	r.Add("lease/renew/unary-vs-etcd/leases=8", 1.25, "x")
	rows := map[string]string{}
	for _, row := range Summary(r.Results()) {
		rows[row.Figure] = row.Value
	}
	const figure = "unary renew ÷ etcd fenced renew, by leases"
	if got, want := rows[figure], "1: 0.70× (first pass 800 vs 1,000/s); 8: 1.25×"; got != want {
		t.Errorf("%s: got %q, want %q", figure, got, want)
	}
}

// The termination alone on both stores (supervisor/terminate-stores) joins
// the etcd-vs-Badger row, and its results are no "largest subtree" of
// etcd's when they are Badger's.
func TestSummaryTerminationAlone(t *testing.T) {
	r := &Report{}
	r.Add("supervisor/terminate-stores/badger/terminate-abort/agents=1000", 40, "ms")
	r.Add("supervisor/terminate-stores/etcd/terminate-abort/agents=1000", 100, "ms")
	r.Add("supervisor/terminate-stores/etcd-vs-badger/agents=1000", 2.5, "x")
	r.Add("supervisor/terminate-stores/etcd-vs-badger-cpu/agents=1000", 3, "x")
	r.Add("supervisor/terminate-stores/badger/terminate-abort/agents=10000", 500, "ms")
	rows := map[string]string{}
	for _, row := range Summary(r.Results()) {
		rows[row.Figure] = row.Value
	}
	for figure, want := range map[string]string{
		"terminate 1,000 agents, etcd vs Badger":  "termination alone 1k: 100 ms vs 40.00 ms, 2.50× (3.00× CPU)",
		"largest subtree one termination covered": "Badger 10,000 (500 ms); etcd 1,000 (100 ms)",
	} {
		if got := rows[figure]; got != want {
			t.Errorf("%s: got %q, want %q", figure, got, want)
		}
	}
}

// TestMCPToolsCallScenario runs the MCP scenario briefly: its 16 agents
// are 16 nodes, so the gateway's per-node bound on sessions does not
// refuse them (a single node's 17 sessions are refused, and the scenario
// fails). The throughput it measures in 50 ms may be zero on a loaded
// machine (the sessions' first calls are slow): only the figure's presence
// says the scenario ran through.
func TestMCPToolsCallScenario(t *testing.T) {
	r := &Report{Dir: t.TempDir(), Duration: 50 * time.Millisecond}
	srv, err := startServer(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := mcpToolsCall(t.Context(), r, srv); err != nil {
		t.Fatal(err)
	}
	for _, res := range r.Results() {
		if res.Name == "mcp/tools-call/gateway-throughput-16-agents" {
			return
		}
	}
	t.Fatalf("no gateway throughput in %v", r.Results())
}

// TestMain lets this test binary serve as the client process of a
// measurement whose clients run apart (ServeClients), as tether-bench does.
func TestMain(m *testing.M) {
	if ServeClients() {
		return
	}
	os.Exit(m.Run())
}

// The spawns measured from a client process of their own (this test binary,
// through TestMain) are real spawns on the server: the parent's subtree
// holds every child the client process reports (and at most the one in
// flight when the run ended), and measureSpawnsApart reports its figures.
func TestSpawnsApart(t *testing.T) {
	ctx := context.Background()
	r := &Report{Duration: 300 * time.Millisecond, Dir: t.TempDir()}
	srv, err := startServer(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	root, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "apart"}))
	if err != nil {
		t.Fatal(err)
	}
	parent, err := srv.Admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "parent"}))
	if err != nil {
		t.Fatal(err)
	}
	run, err := runClientsApart(ctx, clientJob{URL: srv.URL, Op: "spawn", Credentials: []string{parent.Msg.Credential},
		Parents: []string{parent.Msg.Node.NodeId}, Duration: r.Duration})
	if err != nil {
		t.Fatal(err)
	}
	children := -1 // the parent is in its own subtree
	for page := ""; ; {
		resp, err := srv.Admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: parent.Msg.Node.NodeId, PageToken: page}))
		if err != nil {
			t.Fatal(err)
		}
		children += len(resp.Msg.Nodes)
		if page = resp.Msg.NextPageToken; page == "" {
			break
		}
	}
	if int64(children) < run.Calls || int64(children) > run.Calls+1 {
		t.Fatalf("the client process reported %d spawns; the parent has %d children", run.Calls, children)
	}

	if err := measureSpawnsApart(ctx, r, srv, 2, false); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, res := range r.Results() {
		got[res.Name] = true
	}
	for _, name := range []string{
		"supervisor/spawn-durable-apart/rpc-floor/clients=2",
		"supervisor/spawn-durable-apart/clients=2",
	} {
		if !got[name] {
			t.Errorf("no %s in %v", name, r.Results())
		}
	}
	// A job the client process cannot run is an error here, with its reason.
	_, err = runClientsApart(ctx, clientJob{URL: srv.URL, Op: "renew", Credentials: []string{"x"}, Parents: []string{"y"}, Duration: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), `unknown op "renew"`) {
		t.Fatalf("an unknown op: got %v", err)
	}
}
