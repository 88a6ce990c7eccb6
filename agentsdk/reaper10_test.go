//go:build linux

package agentsdk_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// TestReaperHelperRogue is not a test: it is the rogue agent of
// TestARogueAgentCannotEscapeItsLauncherWithSetsidAndADoubleFork (this test
// binary, re-executed). As the agent ("agent") it starts itself again in a
// session of its own ("middle"), which starts a sleeping grandchild, writes
// the grandchild's pid and exits at once, leaving the grandchild an orphan
// outside the agent's process group and session; then the agent exits.
func TestReaperHelperRogue(t *testing.T) {
	role := os.Getenv("TETHER_REAPER_ROLE")
	pidFile := os.Getenv("TETHER_REAPER_PIDFILE")
	switch role {
	case "agent":
		cmd := exec.Command(os.Args[0], "-test.run=^TestReaperHelperRogue$")
		cmd.Env = append(os.Environ(), "TETHER_REAPER_ROLE=middle")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Run(); err != nil {
			os.Exit(3)
		}
		if gate := os.Getenv("TETHER_REAPER_GATE"); gate != "" {
			// Exit only once the test says so (it writes the FIFO).
			f, err := os.Open(gate)
			if err != nil {
				os.Exit(7)
			}
			_, _ = io.ReadAll(f)
		}
		os.Exit(0)
	case "middle":
		grandchild := exec.Command("sleep", "600")
		if os.Getenv("TETHER_REAPER_LEADERLESS") == "1" {
			// rogue41l: a grandchild whose main thread exits while
			// another of its threads runs on (rogue41l_linux_test.go).
			grandchild = exec.Command(os.Args[0], "-test.run=^$")
			grandchild.Env = append(os.Environ(), "TETHER_REAPER_ROLE=leaderless")
		}
		if err := grandchild.Start(); err != nil {
			os.Exit(4)
		}
		if err := os.WriteFile(pidFile+".tmp", []byte(strconv.Itoa(grandchild.Process.Pid)), 0o600); err != nil {
			os.Exit(5)
		}
		if err := os.Rename(pidFile+".tmp", pidFile); err != nil {
			os.Exit(6)
		}
		os.Exit(0) // without waiting: the grandchild is orphaned
	default:
		// By design: this test is the rogue agent's body, run only as a
		// process the reaper tests start (TETHER_REAPER_ROLE set).
		t.Skip("the rogue agent process of the reaper test")
	}
}

// procStat returns the fields of /proc/<pid>/stat after the command name:
// [0] state, [1] ppid, [2] pgrp, [3] session, …
func procStat(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// A rogue agent cannot escape its launcher with setsid and a double fork.
// The launcher killed what was left of the agent's process group before it
// confirmed the exit; a grandchild started in a session of its own, whose
// parent then exited, was reparented to init and went on running — with
// the node's credential in its environment — after the launcher had told
// the control plane the agent was gone, and the record said "confirmed".
// The launcher is a child subreaper on Linux: the orphan is reparented to
// it, and it kills and reaps every orphan that started after the agent's
// process and that no os.Process of the program holds before it confirms.
// A process the program itself started meanwhile (here the test's own
// child) is not touched.
func TestARogueAgentCannotEscapeItsLauncherWithSetsidAndADoubleFork(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	env := []string{"TETHER_REAPER_ROLE=agent", "TETHER_REAPER_PIDFILE=" + pidFile}
	rogue := agentsdk.Version{Name: "v1", Command: os.Args[0], Args: []string{"-test.run=^TestReaperHelperRogue$"}, Env: env}
	benign := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"600"}}
	l := runLauncher(t, srv, []agentsdk.Version{rogue, benign})
	var first string
	testserver.WaitFor(t, 30*time.Second, "the rogue's process to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	// The program running the launcher starts a process of its own while
	// the agent runs: it is no agent's, and must survive the agent's exit.
	own := exec.Command("sleep", "600")
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Process.Kill(); _ = own.Wait() }()

	pid, err := strconv.Atoi(strings.TrimSpace(readWhenThere(t, "the rogue to leave a grandchild behind", pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if alive(pid) {
		// The grandchild is outside the agent's group and session: what
		// the launcher's group kill cannot reach.
		if st := procStat(t, pid); st[3] == strconv.Itoa(mustSID(t)) {
			t.Fatalf("the grandchild (pid %d) is in the test's session %s: the rogue did not escape", pid, st[3])
		}
	}
	testserver.WaitFor(t, 30*time.Second, "the launcher to confirm the rogue's exit", func() bool {
		return getNode(t, admin, first).ExitConfirmedBy != ""
	})
	if alive(pid) {
		st := procStat(t, pid)
		t.Errorf("the launcher confirmed node %s's exit while the rogue's grandchild (pid %d, parent %s, session %s), holding the node's credential, runs on", first, pid, st[1], st[3])
	}
	if !alive(own.Process.Pid) {
		t.Errorf("the launcher killed a process the program itself started (pid %d)", own.Process.Pid)
	}
}

func mustSID(t *testing.T) int {
	t.Helper()
	sid, err := strconv.Atoi(procStat(t, os.Getpid())[3])
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// logSignal is a slog handler that signals when a record's message is msg.
type logSignal struct {
	msg  string
	seen chan struct{}
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSignal) WithGroup(string) slog.Handler      { return h }

// The launcher does not confirm an exit while what the agent left behind
// cannot be proven gone: the rogue's grandchild is frozen (a cgroup v1
// freezer, where SIGKILL waits for the thaw) before the agent exits; the
// launcher says it is not proven gone and the node is not confirmed; once
// thawed it is killed, reaped, and the exit confirmed. Needs root and the
// v1 freezer.
func TestALauncherDoesNotConfirmAnExitWhileTheRoguesGrandchildLives(t *testing.T) {
	freezer := filepath.Join("/sys/fs/cgroup/freezer", "tether-reaper10-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(freezer, 0o755); err != nil {
		t.Skipf("no cgroup v1 freezer to hold a process past SIGKILL: %v", err)
	}
	t.Cleanup(func() {
		// Thawed and emptied (what is killed leaves it once it exits),
		// then removed.
		_ = os.WriteFile(filepath.Join(freezer, "freezer.state"), []byte("THAWED"), 0o644)
		testserver.WaitFor(t, 30*time.Second, "the freezer cgroup to empty", func() bool {
			b, err := os.ReadFile(filepath.Join(freezer, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return err != nil || len(strings.TrimSpace(string(b))) == 0
		})
		_ = os.Remove(freezer)
	})
	r := launchRogue(t, 100*time.Millisecond, "^TestReaperHelperRogue$", "the rogue to leave a grandchild behind", "TETHER_REAPER_ROLE=agent")
	admin, gate, unproven, first, pid := r.admin, r.gate, r.unproven, r.node, r.pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := os.WriteFile(filepath.Join(freezer, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(freezer, "freezer.state"), []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the grandchild to be frozen", func() bool {
		b, err := os.ReadFile(filepath.Join(freezer, "freezer.state"))
		return err == nil && strings.TrimSpace(string(b)) == "FROZEN"
	})
	letTheAgentExit(t, gate, unproven, admin, first)
	if !alive(pid) {
		t.Fatalf("the frozen grandchild (pid %d) is gone", pid)
	}
	if by := getNode(t, admin, first).ExitConfirmedBy; by != "" {
		t.Fatalf("the launcher confirmed node %s's exit (by %q) while the rogue's grandchild (pid %d) lives", first, by, pid)
	}
	if err := os.WriteFile(filepath.Join(freezer, "freezer.state"), []byte("THAWED"), 0o644); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the launcher to confirm the rogue's exit once the grandchild is gone", func() bool {
		return getNode(t, admin, first).ExitConfirmedBy != ""
	})
	if alive(pid) {
		t.Errorf("the launcher confirmed node %s's exit while the rogue's grandchild (pid %d) runs on", first, pid)
	}
}

// launchedRogue is a rogue agent process (this test binary, run as the
// helper its environment names) started by a real Launcher ahead of a
// benign next version, with what it wrote to its pid file once it did.
type launchedRogue struct {
	admin    *testserver.Clients
	gate     string     // the fifo the rogue waits on before it exits
	unproven *logSignal // the launcher's log of an exit not proven
	node     string     // the rogue's node
	pid      int        // the pid (or group) the rogue wrote
}

// launchRogue starts a server and a launcher whose first version is this
// test binary run with -test.run=run and env (beside its pid file and
// gate), its kill grace grace, and waits for the rogue to start and to
// write its pid file (what: what the wait is for).
func launchRogue(t *testing.T, grace time.Duration, run, what string, env ...string) launchedRogue {
	t.Helper()
	srv := testserver.Start(t)
	dir := t.TempDir()
	pidFile, gate := filepath.Join(dir, "rogue.pid"), filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	env = append([]string{"TETHER_REAPER_PIDFILE=" + pidFile, "TETHER_REAPER_GATE=" + gate}, env...)
	rogue := agentsdk.Version{Name: "v1", Command: os.Args[0], Args: []string{"-test.run=" + run}, Env: env}
	benign := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"600"}}
	unproven := &logSignal{msg: "what the agent left behind is not proven gone", seen: make(chan struct{}, 1)}
	l := runLauncher(t, srv, []agentsdk.Version{rogue, benign}, func(cfg *agentsdk.LauncherConfig) {
		cfg.KillGrace, cfg.Log = grace, slog.New(unproven)
	})
	var first string
	testserver.WaitFor(t, 30*time.Second, "the rogue's process to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	pid, err := strconv.Atoi(strings.TrimSpace(readWhenThere(t, what, pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	return launchedRogue{admin: srv.AdminClients(), gate: gate, unproven: unproven, node: first, pid: pid}
}

// letTheAgentExit opens the helper agent's gate (a FIFO it waits on before
// it exits) and waits until the launcher confirms the agent's exit or
// logs that what it left behind is not proven gone.
func letTheAgentExit(t *testing.T, gate string, unproven *logSignal, admin *testserver.Clients, node string) {
	t.Helper()
	f, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	testserver.WaitFor(t, 30*time.Second, "the launcher to confirm the exit or say what the rogue left is not proven gone", func() bool {
		select {
		case <-unproven.seen:
			return true
		default:
			return getNode(t, admin, node).ExitConfirmedBy != ""
		}
	})
}
