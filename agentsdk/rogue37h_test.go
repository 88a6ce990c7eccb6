//go:build linux

package agentsdk_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// lockedBuffer is a bytes.Buffer the launcher's copying goroutines and the
// test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// rogue37HProbe is a v1 agent that, once its v2 replacement runs beside it
// (found by its command line, which any user may read), tries what an
// agent under its launcher's user can: read its launcher's environment
// (where a program takes its operator token from), signal its launcher,
// and read its replacement's environment (the replacement node's
// credential). It prints one line per try, then waits to be stopped.
const rogue37HProbe = `
try() { if "$@" >/dev/null 2>&1; then echo "$probe: reached"; else echo "$probe: refused"; fi; }
launcher=$PPID
while :; do
  for d in /proc/[0-9]*; do
    if tr '\0' ' ' < "$d/cmdline" 2>/dev/null | grep -q '^sleep 3737 '; then v2=${d#/proc/}; fi
  done
  [ -n "$v2" ] && break
  sleep 0.05
done
probe=launcher-environ try cat /proc/$launcher/environ
probe=launcher-signal try kill -0 $launcher
probe=replacement-environ try grep -q TETHER_CREDENTIAL= /proc/$v2/environ
echo probed
exec sleep 600
`

// TestRogue37HAnAgentCannotReachItsLauncherOrItsReplacement: every agent
// ran under its launcher's user, so a rogue v1 draining beside its v2
// replacement read its launcher's environment (and, without Yama, its
// memory: the operator token with which it acts as an operator), could
// kill its launcher (leaving its own process and node unsupervised and
// its exit never confirmed), and read its replacement's credential. The
// launcher could not help it: a version had no user of its own. A version
// names one (Version.RunAs): its processes run as that user, with only
// that user's groups, and reach neither the launcher nor another
// version's processes.
func TestRogue37HAnAgentCannotReachItsLauncherOrItsReplacement(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("By design: running an agent as another user needs root (CAP_SETUID, CAP_SETGID); make test and CI run as root in the dev container")
	}
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	var out lockedBuffer
	v1 := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", rogue37HProbe}, RunAs: &agentsdk.User{UID: 65534, GID: 65534}}
	v2 := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"3737", "600"}, RunAs: &agentsdk.User{UID: 65533, GID: 65533}}
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) { cfg.Stdout = &out })
	var first string
	testserver.WaitFor(t, 30*time.Second, "v1 to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	// Drain v1 (a long window): the launcher starts v2 beside it.
	drainForUpgrade(t, admin, first)
	testserver.WaitFor(t, 30*time.Second, "the rogue v1 to probe its launcher and its replacement", func() bool {
		return strings.Contains(out.String(), "probed")
	})
	for _, probe := range []string{"launcher-environ", "launcher-signal", "replacement-environ"} {
		if !strings.Contains(out.String(), probe+": refused") {
			t.Errorf("the rogue v1 (%s): %s", probe, out.String())
		}
	}
}

// TestRogue37HALauncherRetriesAReplacementThatFailedToStart: a rogue v1
// under its launcher's user moves its v2 replacement's executable aside
// (it could as well spend the user's process limit), then is drained. The
// launcher's start of v2 failed, and it never tried again: the drained
// node was never replaced, the rollout waited for a replacement that would
// not come (and so did a replacement whose registration met a control
// plane restarting in its own rolling upgrade). A failed start is due again
// after the restart backoff, on the launcher's clock, until it succeeds.
func TestRogue37HALauncherRetriesAReplacementThatFailedToStart(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	v2Path := filepath.Join(t.TempDir(), "v2")
	if err := os.WriteFile(v2Path, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	clk := &manualClock{now: time.Now().UTC()}
	logs := &countingHandler{}
	v1 := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", `mv "$0" "$0.aside" && echo moved; exec sleep 600`, v2Path}}
	v2 := agentsdk.Version{Name: "v2", Command: v2Path}
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) {
		cfg.Stdout, cfg.Clock, cfg.Log = &out, clk, slog.New(logs)
	})
	var first string
	testserver.WaitFor(t, 30*time.Second, "v1 to move v2's executable aside", func() bool {
		first, _ = l.Current()
		return first != "" && strings.Contains(out.String(), "moved")
	})
	drainForUpgrade(t, admin, first)
	testserver.WaitFor(t, 30*time.Second, "the launcher to fail to start v2", func() bool {
		return logs.count("launcher step failed; retrying") > 0
	})
	if err := os.Rename(v2Path+".aside", v2Path); err != nil {
		t.Fatal(err)
	}
	clk.advance(agentsdk.MinRestartBackoff)
	testserver.WaitFor(t, 30*time.Second, "the launcher to start v2 once it can", func() bool {
		_, version := l.Current()
		return version == "v2"
	})
}

// TestRogue37HARestartedLauncherEndsWhatItsPredecessorLeftRunning: a
// rogue agent under its launcher's user kills its launcher (or the
// launcher crashes, or is restarted, with a crash-looping agent). The
// launcher's successor knew nothing of the nodes its predecessor had
// registered: their processes, if alive, ran on unsupervised, and their
// nodes stayed running — credentials alive, nothing revoked, no record —
// until an operator or a rollout found them. A launcher with an Instance
// labels its nodes with it and, when it starts, terminates (abort) the
// root nodes with its label that no termination covers: a predecessor's
// (the abort then revokes what it held and writes its record). Another
// instance's nodes, and nodes without the label, are left be.
func TestRogue37HARestartedLauncherEndsWhatItsPredecessorLeftRunning(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	register := func(labels map[string]string) string {
		t.Helper()
		resp, err := admin.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue", Labels: labels}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Node.NodeId
	}
	// The predecessor's node: its process (the rogue) killed the launcher
	// that registered it.
	left := register(map[string]string{"version": "v1", agentsdk.InstanceLabel: "host-1.rogue"})
	other := register(map[string]string{"version": "v1", agentsdk.InstanceLabel: "host-2.rogue"})
	unlabelled := register(map[string]string{"version": "v1"})
	v := agentsdk.Version{Command: "sleep", Args: []string{"600"}}
	v1, v2 := v, v
	v1.Name, v2.Name = "v1", "v2"
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) { cfg.Instance = "host-1.rogue" })
	var stop string
	testserver.WaitFor(t, 30*time.Second, "a termination of the predecessor's node", func() bool {
		stop = getNode(t, admin, left).TerminationId
		return stop != ""
	})
	term, err := admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: stop}))
	if err != nil {
		t.Fatal(err)
	}
	if term.Msg.Termination.Mode != tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		t.Errorf("the predecessor's node is stopped by %v, want the launcher's abort", term.Msg.Termination)
	}
	var current string
	testserver.WaitFor(t, 30*time.Second, "the launcher's own agent to start", func() bool {
		current, _ = l.Current()
		return current != ""
	})
	if got := getNode(t, admin, current).Labels[agentsdk.InstanceLabel]; got != "host-1.rogue" {
		t.Errorf("the launcher's node is labelled %s=%q, want host-1.rogue", agentsdk.InstanceLabel, got)
	}
	for _, id := range []string{other, unlabelled, current} {
		if n := getNode(t, admin, id); n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
			t.Errorf("node %s (labels %v) is %v; only the predecessor's may be stopped", id, n.Labels, n.State)
		}
	}
}

// TestRogue37HARestartedLauncherBacksOffAtOnce: an agent that dies at once
// and kills its launcher first had every launcher run start it and restart
// it at once (the backoff starts afresh with each run). A run that finds
// its predecessor's node treats its own start as a restart: the first
// unasked death waits for the backoff, on the launcher's clock.
func TestRogue37HARestartedLauncherBacksOffAtOnce(t *testing.T) {
	srv := testserver.Start(t)
	if _, err := srv.AdminClients().Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{
		Name: "looper", Labels: map[string]string{"version": "v1", agentsdk.InstanceLabel: "host-1.looper"},
	})); err != nil {
		t.Fatal(err)
	}
	clk := &manualClock{now: time.Now().UTC()}
	logs := &countingHandler{}
	runLauncher(t, srv, helperVersions("TETHER_LAUNCHER_HELPER_LOOP=1"), func(cfg *agentsdk.LauncherConfig) {
		cfg.Name, cfg.Instance, cfg.Clock, cfg.Log = "looper", "host-1.looper", clk, slog.New(logs)
	})
	testserver.WaitFor(t, 60*time.Second, "the launcher to wait before restarting the crash loop", func() bool {
		return logs.count("waiting before restarting the agent") > 0 || logs.count("agent started") > 10
	})
	if n := logs.count("agent started"); n != 1 {
		t.Fatalf("a launcher run that found its predecessor's node started the crash loop %d times before its clock moved; want 1", n)
	}
	clk.advance(agentsdk.MinRestartBackoff)
	testserver.WaitFor(t, 60*time.Second, "the restart once the backoff passed", func() bool {
		return logs.count("agent started") >= 2
	})
}

func init() {
	helperLeaveGroup = func() {
		// Into its launcher's process group (allowed within one
		// session), leaving its own group empty; then it says where it
		// is, and whether it left. Since the thirty-eighth pass it starts
		// as the leader of a session of its own (Setsid), which may not
		// change its group: it stays, and runs on in its own group.
		pg, err := syscall.Getpgid(os.Getppid())
		left := err == nil && syscall.Setpgid(0, pg) == nil
		_ = os.WriteFile(os.Getenv("TETHER_LAUNCHER_HELPER_PIDFILE"), []byte(strconv.Itoa(os.Getpid())+" "+strconv.FormatBool(left)), 0o600)
	}
}

// TestRogue37HAnAgentThatLeavesItsGroupIsStillStopped: the launcher
// signalled only an agent's process group (SIGTERM, then SIGKILL), never
// its process. A rogue v1 that moved itself into its launcher's process
// group (setpgid, allowed within the session) left its own group empty:
// having claimed its exit and run on, it was never stopped, its exit never
// confirmed — and the launcher's own shutdown would wait for it forever.
// The launcher signals the process it started (through its pidfd) as well
// as its group; and since the thirty-eighth pass an agent leads a session
// of its own, and cannot leave its group at all (which the test asserts:
// the pidfd is the defence behind it).
func TestRogue37HAnAgentThatLeavesItsGroupIsStillStopped(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	pidFile := filepath.Join(t.TempDir(), "pid")
	first := launchedToV2(t, srv, agentsdk.LauncherConfig{Name: "leaver", KillGrace: 5 * time.Second,
		Versions: helperVersions("TETHER_LAUNCHER_HELPER_LIE=1", "TETHER_LAUNCHER_HELPER_LEAVEGROUP=1", "TETHER_LAUNCHER_HELPER_PIDFILE="+pidFile)})
	// Runs before the launcher's own cleanup (its shutdown would wait
	// for the rogue, before the fix, forever).
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.Fields(string(b))[0]); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	testserver.WaitFor(t, 30*time.Second, "the launcher to stop the rogue that tried to leave its group and confirm its exit", func() bool {
		return hasLauncherConfirmation(getNode(t, admin, first))
	})
	// The rogue ran on after its attempt (it claimed its exit after it),
	// and could not leave: it leads a session of its own
	// (TestRogue38HAnAgentCannotTypeIntoItsLaunchersTerminal). Were it
	// let out, the launcher would still stop it through its pidfd.
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the rogue never said whether it left its group: %v", err)
	}
	if f := strings.Fields(string(b)); len(f) != 2 || f[1] != "false" {
		t.Fatalf("the rogue says %q (pid, left its group): an agent moved itself out of its process group", b)
	}
}

// drainForUpgrade has the operator drain node for an upgrade, with a
// drain window (ten minutes) longer than any test: the launcher starts
// the next version beside it.
func drainForUpgrade(t *testing.T, admin *testserver.Clients, node string) {
	t.Helper()
	if _, err := admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "upgrade", DrainWindow: durationpb.New(10 * time.Minute),
	})); err != nil {
		t.Fatal(err)
	}
}
