//go:build unix

package mcpgate

import (
	"os/exec"
	"syscall"
)

// ownGroup starts cmd (a stdio upstream) as the leader of a process group
// of its own, so that what it starts can be stopped with it (endGroup).
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// endGroup kills what is left of the process group of cmd, a stdio
// upstream whose connection has closed (the MCP SDK has waited for its
// own process, or killed it). A process that left the group (setsid) is
// beyond it; on Linux the orphans sweep that follows reaches it
// (abandonableWrites.Close). The group's id is not handed to another process while any
// member is left, so the signal reaches no other group then; once none
// is, the kill (sent as soon as the leader has been waited for) finds
// none, unless the kernel handed the leader's pid to a new group leader
// in between.
func endGroup(cmd *exec.Cmd) {
	if cmd.Process == nil || cmd.Process.Pid <= 0 {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
