//go:build linux

package agentsdk_test

import (
	"io"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// rogue46fChains is how many runners side by side the rogue of
// TestRogue46FARunnerThatForksAndExitsInALoopIsKilledBeforeTheExitIsConfirmed
// leaves behind.
const rogue46fChains = 8

// The rogue agent of
// TestRogue46FARunnerThatForksAndExitsInALoopIsKilledBeforeTheExitIsConfirmed
// (this test binary, re-executed with TETHER_REAPER_ROLE=runner46f): it
// forks a child that leaves its session and process group (setsid) and
// becomes rogue46fChains runners, each forking a copy of itself and
// exiting at once, for ever: a process whose pid is a new one every few
// dozen microseconds. It writes the runners' session (and group) id to
// TETHER_REAPER_PIDFILE and exits when the test opens its gate.
//
// The fork is the raw system call, as os/exec's own is: the child runs
// nothing but raw system calls on the one thread it has (no allocation,
// no scheduling), so the Go runtime it copied is never entered.
func init() {
	if os.Getenv("TETHER_REAPER_ROLE") != "runner46f" {
		return
	}
	runtime.LockOSThread()
	pid, _, errno := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0)
	if errno != 0 {
		os.Exit(3)
	}
	if pid == 0 {
		rogue46fRun()
	}
	pidFile := os.Getenv("TETHER_REAPER_PIDFILE")
	if err := os.WriteFile(pidFile+".tmp", []byte(strconv.Itoa(int(pid))), 0o600); err != nil {
		os.Exit(5)
	}
	if err := os.Rename(pidFile+".tmp", pidFile); err != nil {
		os.Exit(6)
	}
	f, err := os.Open(os.Getenv("TETHER_REAPER_GATE"))
	if err != nil {
		os.Exit(7)
	}
	_, _ = io.ReadAll(f)
	os.Exit(0)
}

// rogue46fRun is the runners' body, in the forked child: raw system calls
// only.
//
//go:nosplit
func rogue46fRun() {
	syscall.RawSyscall(syscall.SYS_SETSID, 0, 0, 0)
	for range rogue46fChains - 1 {
		if pid, _, _ := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0); pid == 0 {
			break
		}
	}
	for {
		pid, _, errno := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0)
		if errno == 0 && pid != 0 {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
	}
}

// groupLeft reports whether process group pgrp has a process left once
// the test's process, which adopted the runners (the launcher's: a child
// subreaper), has reaped every exited one of the group: a runner lives a
// few dozen microseconds, too short to be seen reading /proc, but while
// any runs the group has a member, and once none does its zombies are
// all the test's to reap.
func groupLeft(pgrp int) bool {
	for {
		var ws syscall.WaitStatus
		if pid, err := syscall.Wait4(-pgrp, &ws, syscall.WNOHANG, nil); err != nil || pid <= 0 {
			break
		}
	}
	return syscall.Kill(-pgrp, 0) == nil
}

// A rogue agent cannot escape its launcher by leaving behind processes
// that fork and exit in a loop. Its escapee leaves the agent's session and
// group (setsid) and becomes eight runners, each forking a copy of itself
// and exiting at once: every pid the launcher's sweep finds is gone (a
// zombie) by the time its SIGKILL comes, the child it forked running on.
// The sweep killed pid by pid, round after round, until its deadline:
// "processes left behind still run after SIGKILL", the exit never
// confirmed (the record unaccounted) and the runners, out of reach, ran on
// for good — every later sweep outrun the same way. The sweep now also
// kills the process group of what it finds, when every member of the group
// it saw is an orphan's (or below one): the kernel signals a group whole,
// a fork under way included. The runners are gone and the exit confirmed.
func TestRogue46FARunnerThatForksAndExitsInALoopIsKilledBeforeTheExitIsConfirmed(t *testing.T) {
	r := launchRogue(t, 2*time.Second, "^$", "the rogue to leave its runners behind", "TETHER_REAPER_ROLE=runner46f")
	admin, gate, unproven, first, group := r.admin, r.gate, r.unproven, r.node, r.pid
	// The kernel signals the whole group at once: the runners end here
	// whatever the launcher did.
	t.Cleanup(func() { _ = syscall.Kill(-group, syscall.SIGKILL) })
	letTheAgentExit(t, gate, unproven, admin, first)
	if groupLeft(group) {
		t.Errorf("after the rogue's exit the launcher's sweep ended with its runners (process group %d) still running", group)
	}
	if by := getNode(t, admin, first).ExitConfirmedBy; by == "" {
		t.Errorf("the launcher did not confirm node %s's exit: what the rogue left behind was not proven gone", first)
	}
}
