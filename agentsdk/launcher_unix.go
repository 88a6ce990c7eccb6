//go:build unix

package agentsdk

import (
	"os/exec"
	"syscall"
)

// ownGroup starts cmd in a session of its own, which makes it a process
// group of its own, so that the launcher can signal everything the
// agent's process started, not only the process. A session rather than
// only a group: in its launcher's session the agent shared its
// launcher's controlling terminal, and could open it (/dev/tty) and type
// into it (TIOCSTI) — commands the operator's shell runs once the
// launcher stops — whatever user it ran as; nor can a process of its
// session join its launcher's process group (rogue38h test).
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
}

// canRunAs: a version's processes can run as a user of their own.
const canRunAs = true

// runAs starts cmd as u (nil: the launcher's own user), with u's groups
// only: the process can then neither read the launcher's environment or
// memory nor signal it, nor reach another user's agent processes.
func runAs(cmd *exec.Cmd, u *User) {
	if u == nil {
		return
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// signalGroup sends sig to the process group cmd leads (what is left of
// it once cmd has exited), and to cmd's process itself: the process may
// have left the group (setpgid into another group of its session, its
// launcher's included), leaving it empty (rogue37h test). os.Process
// signals through its pidfd where there is one, and not at all once the
// process is waited for, so a reused pid is never signalled.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	_ = cmd.Process.Signal(sig)
}
