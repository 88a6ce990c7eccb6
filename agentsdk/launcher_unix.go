//go:build unix

package agentsdk

import (
	"os/exec"
	"syscall"
)

// ownGroup starts cmd in a process group of its own, so that the
// launcher can signal everything the agent's process started, not only
// the process.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// signalGroup sends sig to the process group cmd leads (what is left of
// it once cmd has exited).
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}
