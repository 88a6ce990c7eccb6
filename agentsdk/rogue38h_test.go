//go:build linux

package agentsdk_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// pidsRunning returns the pids of the processes whose command line starts
// with prefix (arguments joined by spaces), zombies left out.
func pidsRunning(prefix string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		if strings.HasPrefix(strings.ReplaceAll(string(b), "\x00", " "), prefix) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killRunning kills, when the test ends, what runs with the command line
// prefix (what a launcher before the fix left behind).
func killRunning(t *testing.T, prefix string) {
	t.Cleanup(func() {
		for _, pid := range pidsRunning(prefix) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// TestRogue38HAnEscapeeHoldingTheOutputCannotHideTheAgentsExit: the
// launcher learnt of an agent's exit from exec.Cmd.Wait, which, when the
// launcher's Stdout is not a file, waits for the copy of the process's
// output to end too: for every process holding the pipe's write end to
// close it. A rogue v1 that leaves a process in a session of its own
// (setsid) holding its stdout, then dies, hid its death: the launcher
// never saw it exit, so it never terminated its node (left running, its
// credential alive in the escapee's environment), never restarted the
// agent, never swept the escapee (the sweep follows Wait), and its own
// shutdown waited for the escapee forever. The launcher copies the output
// itself, from a pipe whose write end the process is handed as a file:
// Wait returns when the process exits.
func TestRogue38HAnEscapeeHoldingTheOutputCannotHideTheAgentsExit(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	var out lockedBuffer
	v1 := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", `setsid sleep 3838 600 & echo escaped; exit 0`}}
	v2 := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"600"}}
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) { cfg.Stdout, cfg.Stderr = &out, &out })
	// Runs before the launcher's own cleanup, which waited for the
	// escapee before the fix.
	killRunning(t, "sleep 3838 ")
	var first string
	testserver.WaitFor(t, 30*time.Second, "v1 to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	testserver.WaitFor(t, 30*time.Second, "the launcher to see v1 die, and restart the agent at v2", func() bool {
		_, version := l.Current()
		return version == "v2"
	})
	testserver.WaitFor(t, 30*time.Second, "v1's node to be terminated and its exit confirmed by the launcher", func() bool {
		n := getNode(t, admin, first)
		return n.State == tetherv1.NodeState_NODE_STATE_TERMINATED && hasLauncherConfirmation(n)
	})
	if pids := pidsRunning("sleep 3838 "); len(pids) != 0 {
		b, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,sid,stat,lstart,cmd").Output()
		t.Errorf("the escapee v1 left holding its output runs on (pids %v) after its exit was confirmed; self %d\n%s", pids, os.Getpid(), b)
	}
	if !strings.Contains(out.String(), "escaped") {
		t.Errorf("v1's output was not copied: %q", out.String())
	}
}
