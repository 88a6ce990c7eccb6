//go:build linux

package agentsdk_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// The rogue grandchild of TestRogue41LALeaderlessEscapeeIsKilledBeforeTheExitIsConfirmed
// (this test binary, re-executed with TETHER_REAPER_ROLE=leaderless): its
// main thread exits (exit, not exit_group) while a thread of its own runs
// on, blocked for good in a read. /proc/<pid>/stat then says Z — its
// leader's state — while the process lives.
func init() {
	if os.Getenv("TETHER_REAPER_ROLE") != "leaderless" {
		return
	}
	runtime.LockOSThread() // init runs on the main thread; keep it there
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		os.Exit(3)
	}
	ready := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(ready)
		var b [1]byte
		_, _ = syscall.Read(p[0], b[:]) // the write end stays open: never returns
		os.Exit(4)
	}()
	<-ready
	_, _, _ = syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
}

// liveThreads counts process pid's threads that are not zombies (0 once
// the process is gone).
func liveThreads(pid int) int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X' {
			n++
		}
	}
	return n
}

// A rogue agent's escapee is killed before its exit is confirmed even
// when the escapee's main thread has exited. The agent leaves a grandchild
// outside its group and session (setsid and a double fork) whose main
// thread exits while another thread runs on: /proc/<pid>/stat shows its
// leader's state, Z. The launcher's sweep took it for a zombie, sent it
// no signal and waited for it to be reaped, which a thread group with a
// live thread never is: it ran on, out of its launcher's reach for good,
// the exit was never confirmed (the record unaccounted), and every step
// of the launcher spent PollEvery sweeping for it again — Run's goroutine,
// which serves every agent of the launcher. A process whose leader is a
// zombie but that has a thread left is now a live process: killed (the
// signal reaches the whole thread group), reaped, and the exit confirmed.
func TestRogue41LALeaderlessEscapeeIsKilledBeforeTheExitIsConfirmed(t *testing.T) {
	r := launchRogue(t, time.Second, "^TestReaperHelperRogue$", "the rogue to leave a grandchild behind", "TETHER_REAPER_ROLE=agent", "TETHER_REAPER_LEADERLESS=1")
	admin, gate, unproven, first, pid := r.admin, r.gate, r.unproven, r.node, r.pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil) // the test's process adopted it
	})
	testserver.WaitFor(t, 30*time.Second, "the grandchild's main thread to exit while a thread of it runs on", func() bool {
		return !alive(pid) && liveThreads(pid) > 0
	})
	letTheAgentExit(t, gate, unproven, admin, first)
	if n := liveThreads(pid); n > 0 {
		t.Errorf("after the rogue's exit the launcher's sweep ended with its grandchild (pid %d, main thread exited) still running: %d live threads", pid, n)
	}
	if by := getNode(t, admin, first).ExitConfirmedBy; by == "" {
		t.Errorf("the launcher did not confirm node %s's exit: what the rogue left behind was not proven gone", first)
	}
}

// A launcher run after one that died kills the agent process its
// predecessor left even when that process's main thread has exited. The
// agent (under the launcher's user, or one that outlived its launcher's
// crash) exits its main thread and runs on in another: the next run read
// its leader's state, Z, took the process for gone, and left it running,
// out of every launcher's reach. It is now killed, as any process the
// predecessor left.
func TestRogue41LALeaderlessProcessADeadLauncherLeftIsKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the launcher-process test (two launchers started, one killed); make test and CI run them.")
	}
	srv := testserver.Start(t)
	dir := t.TempDir()
	var st struct {
		Procs []struct {
			Pid int `json:"pid"`
		} `json:"procs"`
	}
	readState := func() []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "host-1.looper.state"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Cleanup(func() {
		// Last, once the launchers are killed: the agent processes the
		// last one left (leaderless, they may not heed its SIGTERM).
		_ = readState()
		for _, p := range st.Procs {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		}
	})
	start := func() (*exec.Cmd, *lockedBuffer) {
		t.Helper()
		var logs lockedBuffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestRogue38HHelperLauncher$")
		cmd.Env = append(os.Environ(), "R38H_LAUNCHER=1", "R41L_LEADERLESS=1", "R38H_URL="+srv.URL, "R38H_TOKEN="+srv.Admin, "R38H_STATEDIR="+dir)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		testserver.WaitFor(t, 30*time.Second, "the launcher process to start its agent", func() bool {
			return strings.Contains(logs.String(), "agent started")
		})
		return cmd, &logs
	}
	first, _ := start()
	if b := readState(); len(st.Procs) != 1 {
		t.Fatalf("the first launcher's state: %s; want one process", b)
	}
	pid := st.Procs[0].Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	testserver.WaitFor(t, 30*time.Second, "the agent's main thread to exit while a thread of it runs on", func() bool {
		return !alive(pid) && liveThreads(pid) > 0
	})
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	_, logs := start() // its first start follows its predecessor's processes' end
	if n := liveThreads(pid); n > 0 {
		t.Errorf("the launcher run after a death started its agent with its predecessor's agent (pid %d, main thread exited) still running: %d live threads\n%s", pid, n, logs.String())
	}
}
