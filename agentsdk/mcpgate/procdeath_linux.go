//go:build linux

package mcpgate

import (
	"os/exec"
	"runtime"
	"syscall"
)

// diesWithGateway has the kernel kill cmd (a stdio upstream) with SIGKILL
// when the gateway's process dies without closing it: `tether mcp wrap`
// killed (SIGKILL, the OOM killer, a crash), which ends no connection of
// its own. The upstream ran in a process group of its own (ownGroup), out
// of reach of a kill of the wrapper's group, and one that did not exit at
// its input's end went on with the call in flight for as long as it
// liked, its call never cancelled and its process no one's to stop.
//
// The signal follows the thread that starts the process, not the
// process: start it with startLocked.
func diesWithGateway(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// startLocked runs start (which starts a stdio upstream's process) on a
// thread of its own for the while: Linux sends the parent-death signal
// when the thread that forked exits, and the Go runtime ends a thread
// only when a goroutine locked to it returns without unlocking, which
// start's never does; once unlocked the thread lives as long as the
// process.
func startLocked[T any](start func() (T, error)) (T, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return start()
}
