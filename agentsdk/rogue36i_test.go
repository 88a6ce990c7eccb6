package agentsdk_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue36ILauncherStopsAnAgentThatClaimsItsExitAndRunsOn: a v1 agent
// claims its own exit (its node reads exited, outside any termination)
// and its process runs on. The launcher took the node's state for a drain
// and started the target version beside it, and then left both be: no
// termination covered the old node (nothing it held revoked, no record),
// and its old-version process ran on until the launcher itself stopped.
// The launcher sees the lie (it holds the process): it terminates the node
// and stops the process, and confirms its exit once it is gone.
func TestRogue36ILauncherStopsAnAgentThatClaimsItsExitAndRunsOn(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	first := launchedToV2(t, srv, agentsdk.LauncherConfig{Name: "liar", Versions: helperVersions("TETHER_LAUNCHER_HELPER_LIE=1"), KillGrace: 5 * time.Second})
	testserver.WaitFor(t, 30*time.Second, "the node that claimed its exit and ran on to be terminated", func() bool {
		return getNode(t, admin, first).State == tetherv1.NodeState_NODE_STATE_TERMINATED
	})
	n := getNode(t, admin, first)
	if n.TerminationId == "" {
		t.Fatalf("terminated node %s names no termination", first)
	}
	term, err := admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: n.TerminationId}))
	if err != nil {
		t.Fatal(err)
	}
	if term.Msg.Termination.Mode != tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		t.Fatalf("termination %v, want the launcher's abort", term.Msg.Termination)
	}
	testserver.WaitFor(t, 30*time.Second, "the launcher to confirm the old process gone", func() bool {
		return hasLauncherConfirmation(getNode(t, admin, first))
	})
}

// TestRogue36ILauncherTerminatesAnAgentThatClaimsItsExitAndQuits: an
// agent that claims its exit and exits, unasked, is an exit nobody asked
// for: its node is terminated (abort) so that what it held is revoked and
// reconciled, as the launcher promises. The launcher took the claimed
// exit for a drain (the node's state was no longer running) and left the
// node exited, its grants and leases unrevoked and no record written.
func TestRogue36ILauncherTerminatesAnAgentThatClaimsItsExitAndQuits(t *testing.T) {
	srv := testserver.Start(t)
	first := launchedToV2(t, srv, agentsdk.LauncherConfig{Name: "quitter", Versions: helperVersions("TETHER_LAUNCHER_HELPER_QUIT=1")})
	testserver.WaitFor(t, 30*time.Second, "the node that claimed its exit and quit to be terminated", func() bool {
		return getNode(t, srv.AdminClients(), first).State == tetherv1.NodeState_NODE_STATE_TERMINATED
	})
}

// TestRogue36ILauncherDoesNotRestartACrashLoopWithoutPause: an agent that
// dies as soon as it starts, every version of it, had its launcher
// restart it at once, every time: a new root node, a termination and a
// record per start, as fast as the process could die — the control
// plane's store filled with one rogue's corpses. The launcher restarts
// an agent that died unasked once at once, then waits between restarts
// (MinRestartBackoff, doubling to MaxRestartBackoff) on its clock.
func TestRogue36ILauncherDoesNotRestartACrashLoopWithoutPause(t *testing.T) {
	restartsBackOff(t, testserver.Start(t), agentsdk.LauncherConfig{Name: "looper", Versions: helperVersions("TETHER_LAUNCHER_HELPER_LOOP=1")}, "the crash loop")
}

// restartsBackOff runs a launcher of cfg (the test server's operator, its
// start v1, a clock of the test's) until the test ends, whose agent stops
// as soon as it starts (what): it must be started once and restarted once
// at once, then wait on the launcher's clock, and be started a third time
// only once the clock has moved by MinRestartBackoff.
func restartsBackOff(t *testing.T, srv *testserver.Server, cfg agentsdk.LauncherConfig, what string) {
	t.Helper()
	clk := &manualClock{now: time.Now().UTC()}
	logs := &countingHandler{}
	cfg.Operator = agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	cfg.Start, cfg.PollEvery, cfg.Log, cfg.Clock = "v1", 20*time.Millisecond, slog.New(logs), clk
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testserver.WaitFor(t, 60*time.Second, "the launcher to wait before restarting "+what, func() bool {
		return logs.count("waiting before restarting the agent") > 0 || logs.count("agent started") > 10
	})
	if n := logs.count("agent started"); n != 2 {
		t.Fatalf("%s was started %d times before the launcher's clock moved; want 2 (the start and one restart at once)", what, n)
	}
	clk.advance(agentsdk.MinRestartBackoff)
	testserver.WaitFor(t, 60*time.Second, "the restart once the backoff passed", func() bool {
		return logs.count("agent started") >= 3 && logs.count("waiting before restarting the agent") >= 2
	})
	if n := logs.count("agent started"); n != 3 {
		t.Fatalf("after one backoff %s was started %d times; want 3", what, n)
	}
}

type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// countingHandler counts log records by message.
type countingHandler struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.msgs == nil {
		h.msgs = map[string]int{}
	}
	h.msgs[r.Message]++
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.msgs[msg]
}

func hasLauncherConfirmation(n *tetherv1.Node) bool {
	for _, c := range n.ExitConfirmations {
		if c.Kind == "launcher" {
			return true
		}
	}
	return false
}
