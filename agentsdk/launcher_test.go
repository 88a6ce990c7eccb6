package agentsdk_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// helperLeaveGroup, where set (rogue37h_test.go, Linux), moves the helper
// agent's process out of the process group its launcher started it in.
var helperLeaveGroup func()

// TestLauncherHelperAgent is not a test: it is the agent process the
// launcher tests start (this test binary, re-executed). It joins with the
// credential its launcher handed over, reports ready, and exits once the
// control plane drains it.
func TestLauncherHelperAgent(t *testing.T) {
	if os.Getenv("TETHER_LAUNCHER_HELPER") != "1" {
		t.Skip("the agent process of the launcher tests")
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_LOOP") == "1" {
		os.Exit(7) // a crash loop: every version dies at once
	}
	if dir := os.Getenv("TETHER_LAUNCHER_HELPER_STUBBORN"); dir != "" {
		// rogue40k: deaf to SIGTERM and to its drain; its pid is left in
		// dir for the test to look for.
		signal.Ignore(syscall.SIGTERM)
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(os.Getpid())), nil, 0o600); err != nil {
			os.Exit(9)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := agentsdk.Join(ctx, os.Getenv(agentsdk.EnvAddr), os.Getenv(agentsdk.EnvCredential), nil)
	if err != nil {
		os.Exit(3)
	}
	go a.Run(ctx)
	<-a.Opened()
	if os.Getenv("TETHER_LAUNCHER_HELPER_SELFSTOP") == "1" {
		// A crash loop dressed as a drain: every version proposes its
		// own stop (approved at once by a label policy) and dies.
		if _, err := a.ProposeStop(ctx, "now", "rogue36k"); err != nil {
			os.Exit(8)
		}
		os.Exit(0)
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_CRASH") == "1" && os.Getenv(agentsdk.EnvVersion) == "v1" {
		os.Exit(7) // dies before it is ever ready
	}
	if err := a.ReportReady(ctx); err != nil {
		os.Exit(4)
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_LEAVEGROUP") == "1" && os.Getenv(agentsdk.EnvVersion) == "v1" && helperLeaveGroup != nil {
		helperLeaveGroup() // rogue37h: out of its own process group
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_LIE") == "1" && os.Getenv(agentsdk.EnvVersion) == "v1" {
		// A rogue: it claims its exit and runs on, until something
		// kills it (the launcher's SIGTERM ends it: Go's default).
		if err := a.Exit(ctx, "done"); err != nil {
			os.Exit(6)
		}
		time.Sleep(time.Hour)
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_QUIT") == "1" && os.Getenv(agentsdk.EnvVersion) == "v1" {
		// Done, unasked: it claims its exit and exits.
		if err := a.Exit(ctx, "done"); err != nil {
			os.Exit(6)
		}
		os.Exit(0)
	}
	if os.Getenv("TETHER_LAUNCHER_HELPER_STUBBORN") != "" {
		<-ctx.Done()
		os.Exit(5)
	}
	select {
	case <-a.Draining():
		os.Exit(0) // nothing in flight: drained
	case <-ctx.Done():
		os.Exit(5)
	}
}

func helperVersions(extraEnv ...string) []agentsdk.Version {
	env := append([]string{"TETHER_LAUNCHER_HELPER=1"}, extraEnv...)
	args := []string{"-test.run=^TestLauncherHelperAgent$"}
	return []agentsdk.Version{
		{Name: "v1", Command: os.Args[0], Args: args, Env: env},
		{Name: "v2", Command: os.Args[0], Args: args, Env: env},
	}
}

func getNode(t *testing.T, c *testserver.Clients, id string) *tetherv1.Node {
	t.Helper()
	resp, err := c.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node
}

// TestLauncherRestartsTheAgentAtTheTargetVersionOnDrain: a rollout drains
// the v1 process; the launcher starts v2 as a new node, the v1 process
// exits, and its exit is confirmed by the launcher (the record says so).
func TestLauncherRestartsTheAgentAtTheTargetVersionOnDrain(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	op := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	l, err := agentsdk.NewLauncher(agentsdk.LauncherConfig{
		Operator: op, Name: "planner", Labels: map[string]string{"app": "launched"},
		Versions: helperVersions(), Start: "v1", PollEvery: 20 * time.Millisecond, KillGrace: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var v1 string
	testserver.WaitFor(t, 30*time.Second, "the v1 process to report ready", func() bool {
		node, version := l.Current()
		v1 = node
		return version == "v1" && node != "" && getNode(t, admin, node).ReadyAt != nil
	})
	if err := l.SetTarget("v2"); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{
		Selector: "app=launched,version=v1", TargetSelector: "app=launched,version=v2",
		DrainWindow: durationpb.New(10 * time.Second), ConfirmTimeout: durationpb.New(20 * time.Second),
	}))
	if err != nil {
		t.Fatal(err)
	}
	var r *tetherv1.Rollout
	testserver.WaitFor(t, 30*time.Second, "the rollout to complete", func() bool {
		got, err := admin.Supervisor.GetRollout(ctx, connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: resp.Msg.Rollout.RolloutId}))
		if err != nil {
			t.Fatal(err)
		}
		r = got.Msg.Rollout
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	rec, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: r.Batches[0].RecordId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Msg.Record.Nodes) != 1 || rec.Msg.Record.Nodes[0].NodeId != v1 || rec.Msg.Record.Nodes[0].ConfirmedBy != "operator:admin (launcher)" {
		t.Fatalf("record nodes %v, want %s confirmed by the launcher", rec.Msg.Record.Nodes, v1)
	}
	v2, version := l.Current()
	if version != "v2" || v2 == v1 {
		t.Fatalf("current %s %s, want a new v2 node", v2, version)
	}
	if n := getNode(t, admin, v2); n.State != tetherv1.NodeState_NODE_STATE_RUNNING || n.ReadyAt == nil || n.Labels["version"] != "v2" {
		t.Fatalf("v2 node %v", n)
	}
	// Stopping the launcher stops the process and confirms its exit.
	cancel()
	<-done
	done <- nil
	if n := getNode(t, admin, v2); n.ExitedAt == nil || n.ExitConfirmedBy != "operator:admin (launcher)" {
		t.Fatalf("after the launcher stopped, v2 node exit %v by %q", n.ExitedAt, n.ExitConfirmedBy)
	}
}

// TestLauncherTerminatesAndRestartsAnAgentThatDiesUnasked: an exit nobody
// asked for is confirmed, the node is terminated (so what it held is
// reconciled) and the agent restarts at the target version.
func TestLauncherTerminatesAndRestartsAnAgentThatDiesUnasked(t *testing.T) {
	srv := testserver.Start(t)
	first := launchedToV2(t, srv, agentsdk.LauncherConfig{Name: "flaky", Versions: helperVersions("TETHER_LAUNCHER_HELPER_CRASH=1")})
	testserver.WaitFor(t, 30*time.Second, "the crashed node to be terminated", func() bool {
		n := getNode(t, srv.AdminClients(), first)
		return n.State == tetherv1.NodeState_NODE_STATE_TERMINATED
	})
}

// launchedToV2 runs a launcher of cfg (the test server's operator, its
// start v1, its target v2, a log discarded unless cfg has one) until the
// test ends: it waits for the v1 process to start and for the v2 one that
// replaces it to report ready, and returns the v1 process's node.
func launchedToV2(t *testing.T, srv *testserver.Server, cfg agentsdk.LauncherConfig) string {
	t.Helper()
	cfg.Operator = agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	cfg.Start, cfg.PollEvery = "v1", 20*time.Millisecond
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTarget("v2"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	admin := srv.AdminClients()
	var first string
	testserver.WaitFor(t, 30*time.Second, "the v1 process to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	testserver.WaitFor(t, 30*time.Second, "the v2 replacement to report ready", func() bool {
		node, version := l.Current()
		return version == "v2" && getNode(t, admin, node).ReadyAt != nil
	})
	return first
}
