//go:build !unix

package agentsdk

import (
	"os/exec"
	"syscall"
)

func ownGroup(*exec.Cmd) {}

// canRunAs: outside unix a version cannot name a user (NewLauncher
// refuses it).
const canRunAs = false

func runAs(*exec.Cmd, *User) {}

// signalGroup signals the process only, where there are no process
// groups to signal.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.ProcessState == nil {
		_ = cmd.Process.Signal(sig)
	}
}
