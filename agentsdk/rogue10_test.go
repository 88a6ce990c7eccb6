//go:build unix

package agentsdk_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// runLauncher runs a launcher of versions (v1 first, v2 the target) until
// the test ends; each adjust changes its configuration first.
func runLauncher(t *testing.T, srv *testserver.Server, versions []agentsdk.Version, adjust ...func(*agentsdk.LauncherConfig)) *agentsdk.Launcher {
	t.Helper()
	op := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	cfg := agentsdk.LauncherConfig{
		Operator: op, Name: "rogue", Versions: versions, Start: "v1", PollEvery: 20 * time.Millisecond, KillGrace: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range adjust {
		f(&cfg)
	}
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTarget("v2"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func readWhenThere(t *testing.T, what, path string) string {
	t.Helper()
	var b []byte
	testserver.WaitFor(t, 30*time.Second, what, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0
	})
	return string(b)
}

// A rogue agent cannot read its launcher's operator credential from its
// environment. The launcher started each agent with its own whole
// environment, where a program takes its operator token from
// ($TETHER_TOKEN, as the tether CLI does): every agent it launched held
// an operator's credential, with which it could confirm its own exit,
// end its own termination, or stop anyone. An agent gets the launcher's
// environment without its TETHER_ variables, plus the version's Env and
// the node's own (TETHER_ADDR, TETHER_CREDENTIAL, …).
func TestARogueAgentCannotReadItsLaunchersCredential(t *testing.T) {
	srv := testserver.Start(t)
	t.Setenv("TETHER_TOKEN", srv.Admin)
	t.Setenv("TETHER_OPERATOR_TOKEN_FILE", "/run/secrets/operator.token")
	envFile := filepath.Join(t.TempDir(), "env")
	script := `env > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 600`
	v := agentsdk.Version{Command: "sh", Args: []string{"-c", script, envFile}, Env: []string{"TETHER_AGENT_SETTING=given"}}
	v1, v2 := v, v
	v1.Name, v2.Name = "v1", "v2"
	runLauncher(t, srv, []agentsdk.Version{v1, v2})
	env := readWhenThere(t, "the agent to write its environment", envFile)
	if strings.Contains(env, srv.Admin) {
		t.Errorf("the agent's environment holds its launcher's operator token")
	}
	if strings.Contains(env, "TETHER_OPERATOR_TOKEN_FILE") {
		t.Errorf("the agent's environment holds its launcher's TETHER_ variables")
	}
	for _, want := range []string{"TETHER_AGENT_SETTING=given", agentsdk.EnvCredential + "=", agentsdk.EnvNodeID + "=", "PATH="} {
		if !strings.Contains(env, want) {
			t.Errorf("the agent's environment lacks %s", want)
		}
	}
}

// A rogue agent cannot outlive the exit its launcher attests. The
// launcher confirmed a node's exit (an operator's word, which the record
// trusts) once the process it started had exited, and signalled only that
// process: an agent that left a child behind (here a shell's background
// job) and exited went on running, with its node's credential in its
// environment, after its launcher had told the control plane it was gone.
// The agent runs in a process group of its own, and when its process
// exits the launcher kills what is left of the group before it confirms.
// (A process that leaves the group, setsid and a double fork, is adopted
// and killed on Linux: reaper10_test.go.)
func TestARogueAgentCannotOutliveTheExitItsLauncherConfirms(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	pidFile := filepath.Join(t.TempDir(), "pid")
	rogue := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", `sleep 600 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; exit 0`, pidFile}}
	benign := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"600"}}
	l := runLauncher(t, srv, []agentsdk.Version{rogue, benign})
	var first string
	testserver.WaitFor(t, 30*time.Second, "the rogue's process to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	pid, err := strconv.Atoi(strings.TrimSpace(readWhenThere(t, "the rogue to leave a child behind", pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	testserver.WaitFor(t, 30*time.Second, "the launcher to confirm the rogue's exit", func() bool {
		return getNode(t, admin, first).ExitConfirmedBy != ""
	})
	if alive(pid) {
		t.Errorf("the launcher confirmed node %s's exit while the child its process left behind (pid %d), holding the node's credential, runs on", first, pid)
	}
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// pid (comm) S …: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
