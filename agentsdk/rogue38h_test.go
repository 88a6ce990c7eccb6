//go:build linux

package agentsdk_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"connectrpc.com/connect"

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
	v1 := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", `setsid sleep 38083 600 & echo escaped; exit 0`}}
	v2 := agentsdk.Version{Name: "v2", Command: "sleep", Args: []string{"600"}}
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) { cfg.Stdout, cfg.Stderr = &out, &out })
	// Runs before the launcher's own cleanup, which waited for the
	// escapee before the fix.
	killRunning(t, "sleep 38083 ")
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
	if pids := pidsRunning("sleep 38083 "); len(pids) != 0 {
		b, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,sid,stat,lstart,cmd").Output()
		t.Errorf("the escapee v1 left holding its output runs on (pids %v) after its exit was confirmed; self %d\n%s", pids, os.Getpid(), b)
	}
	if !strings.Contains(out.String(), "escaped") {
		t.Errorf("v1's output was not copied: %q", out.String())
	}
}

// TestRogue38HASecondLauncherOfAnInstanceIsRefused: two launchers run at
// once with one Instance (a unit started twice, a copy-pasted
// configuration, an operator's manual run beside the service) each took
// the other's nodes for a dead predecessor's and aborted them when it
// started: the running launcher's agent was stopped under it. With a
// StateDir the instance is claimed (a lock the launcher holds while it
// runs, released when its process dies): the second launcher is refused
// with an error naming the instance, and touches nothing.
func TestRogue38HASecondLauncherOfAnInstanceIsRefused(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	dir := t.TempDir()
	v := agentsdk.Version{Command: "sleep", Args: []string{"600"}}
	v1, v2 := v, v
	v1.Name, v2.Name = "v1", "v2"
	claim := func(cfg *agentsdk.LauncherConfig) { cfg.Instance, cfg.StateDir = "host-1.excl", dir }
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, claim)
	var first string
	testserver.WaitFor(t, 30*time.Second, "the first launcher's agent to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	cfg := agentsdk.LauncherConfig{
		Operator: agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP)), Name: "rogue",
		Versions: []agentsdk.Version{v1, v2}, Start: "v1", PollEvery: 20 * time.Millisecond, KillGrace: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	claim(&cfg)
	second, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	var runErr error
	returned := false
	testserver.WaitFor(t, 30*time.Second, "the second launcher to be refused, or to stop the first's agent", func() bool {
		select {
		case runErr = <-done:
			returned = true
			return true
		default:
		}
		return getNode(t, admin, first).State != tetherv1.NodeState_NODE_STATE_RUNNING
	})
	cancel()
	if !returned {
		runErr = <-done
	}
	if n := getNode(t, admin, first); n.State != tetherv1.NodeState_NODE_STATE_RUNNING || n.TerminationId != "" {
		t.Errorf("the first launcher's agent is %v (termination %q): the second launcher of its instance stopped it", n.State, n.TerminationId)
	}
	if runErr == nil || !strings.Contains(runErr.Error(), `"host-1.excl"`) || !strings.Contains(runErr.Error(), "another launcher") {
		t.Errorf("the second launcher's Run: %v; want a refusal naming the instance", runErr)
	}
	if node, _ := second.Current(); node != "" {
		t.Errorf("the refused launcher registered node %s", node)
	}
}

// TestRogue38HAStateDirOthersMayWriteIsRefused: a state directory another
// user may write lets that user (a rogue agent under a user of its own)
// hold the instance's lock, keeping every launcher run from starting, or
// rewrite its predecessor's processes for it to kill: Run refuses it, as
// it refuses a StateDir without an Instance.
func TestRogue38HAStateDirOthersMayWriteIsRefused(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	v := agentsdk.Version{Name: "v1", Command: "sleep", Args: []string{"600"}}
	cfg := agentsdk.LauncherConfig{
		Operator: agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP)), Name: "rogue",
		Versions: []agentsdk.Version{v}, Start: "v1", Instance: "host-1.open", StateDir: dir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var runErr error
	testserver.WaitFor(t, 30*time.Second, "Run to refuse the directory, or to start the agent", func() bool {
		select {
		case runErr = <-done:
			return true
		default:
		}
		node, _ := l.Current()
		return node != ""
	})
	cancel()
	if runErr == nil {
		runErr = <-done
	}
	if runErr == nil || !strings.Contains(runErr.Error(), dir) {
		t.Errorf("Run with a state directory anyone may write: %v; want a refusal naming it", runErr)
	}
	cfg.StateDir, cfg.Instance = t.TempDir(), ""
	if _, err := agentsdk.NewLauncher(cfg); err == nil || !strings.Contains(err.Error(), "Instance") {
		t.Errorf("NewLauncher with a StateDir and no Instance: %v; want a refusal", err)
	}
}

// TestRogue38HHelperLauncher is not a test: it is a launcher process the
// rogue38h tests start (this test binary, re-executed) and kill.
func TestRogue38HHelperLauncher(t *testing.T) {
	if os.Getenv("R38H_LAUNCHER") != "1" {
		t.Skip("By design: a helper process, not a test: the launcher the rogue38h tests start (this binary re-executed with R38H_LAUNCHER=1); it runs only there.")
	}
	cfg := agentsdk.LauncherConfig{
		Operator: agentsdk.Dial(os.Getenv("R38H_URL"), os.Getenv("R38H_TOKEN"), agentsdk.WithHTTPClient(testserver.H2CClient())),
		Name:     "looper", Versions: []agentsdk.Version{{Name: "v1", Command: "sleep", Args: []string{"38093", "600"}}},
		Start: "v1", PollEvery: 20 * time.Millisecond, Instance: "host-1.looper", StateDir: os.Getenv("R38H_STATEDIR"),
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	if os.Getenv("R41L_LEADERLESS") == "1" {
		// rogue41l: an agent whose main thread exits while a thread of
		// it runs on (rogue41l_linux_test.go).
		cfg.Versions = []agentsdk.Version{{Name: "v1", Command: os.Args[0], Args: []string{"-test.run=^$"}, Env: []string{"TETHER_REAPER_ROLE=leaderless"}}}
	}
	if out := os.Getenv("R38H_PROBE_OUT"); out != "" {
		cfg.Name, cfg.Instance = "prober", ""
		cfg.Versions = []agentsdk.Version{{Name: "v1", Command: os.Args[0], Args: []string{"-test.run=^TestRogue38HHelperAgent$"}, Env: []string{"R38H_AGENT_OUT=" + out}}}
	}
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Run(context.Background())
}

// TestRogue38HALauncherRunAfterADeathEndsItsPredecessorsProcessesAndBacksOff:
// an agent that kills its launcher (under the launcher's user) as soon as
// it starts, or a launcher that crashes, left its agent's process running
// — unseen by the next run, which only aborted its node — and every run
// started its agent at once (the backoff's doubling lived in memory): a
// crash loop through the launcher was paced by the service manager alone.
// With a StateDir the next run kills the processes its predecessor left
// (pid and start kept in the state file) and, its predecessor having
// started an agent less than MaxRestartBackoff before, waits the backoff
// before its first start, doubling it run after run.
func TestRogue38HALauncherRunAfterADeathEndsItsPredecessorsProcessesAndBacksOff(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the launcher-process test (three launchers started and killed); make test and CI run them.")
	}
	srv := testserver.Start(t)
	dir := t.TempDir()
	killRunning(t, "sleep 38093 ")
	start := func() (*exec.Cmd, *lockedBuffer) {
		t.Helper()
		var logs lockedBuffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestRogue38HHelperLauncher$")
		cmd.Env = append(os.Environ(), "R38H_LAUNCHER=1", "R38H_URL="+srv.URL, "R38H_TOKEN="+srv.Admin, "R38H_STATEDIR="+dir)
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
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	first, _ := start()
	left := pidsRunning("sleep 38093 ")
	if len(left) != 1 {
		t.Fatalf("the first launcher's agent: pids %v", left)
	}
	kill(first)
	second, logs := start()
	testserver.WaitFor(t, 30*time.Second, "the process the dead launcher left to be killed", func() bool {
		for _, pid := range pidsRunning("sleep 38093 ") {
			if pid == left[0] {
				return false
			}
		}
		return true
	})
	if !strings.Contains(logs.String(), "backoff=1s") {
		t.Errorf("the launcher run after a death started its agent without waiting the backoff:\n%s", logs.String())
	}
	kill(second)
	_, logs = start()
	if !strings.Contains(logs.String(), "backoff=2s") {
		t.Errorf("the launcher run after a second death did not double the backoff:\n%s", logs.String())
	}
}

// losingTransport performs every request, but loses the answer of the
// RegisterRoot calls it is told to (the control plane registered the
// root; the launcher hears an error).
type losingTransport struct {
	next http.RoundTripper
	mu   sync.Mutex
	lose map[int]bool // by the RegisterRoot call's number, from 1
	n    int
}

func (t *losingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/RegisterRoot") {
		return t.next.RoundTrip(req)
	}
	t.mu.Lock()
	t.n++
	lose := t.lose[t.n]
	t.mu.Unlock()
	resp, err := t.next.RoundTrip(req)
	if err != nil || !lose {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return nil, errors.New("connection reset by peer (the answer was lost)")
}

// TestRogue38HARegistrationWhoseAnswerWasLostIsEnded: the control plane
// registered the replacement's root, but its answer was lost (a
// connection reset, a control plane restarting in its own rolling
// upgrade — or a rogue v1 that spends the host's connections or memory
// at the moment of its drain). The launcher tried again and ran its agent
// on a second root; the first ran on with no process, its credential
// alive, counted as the replacement by anyone selecting the version,
// until someone stopped it. Every registration is labelled with an id of
// its own (RegistrationLabel): a registration that failed is looked for
// by it and terminated (abort), before and whatever the retry.
func TestRogue38HARegistrationWhoseAnswerWasLostIsEnded(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	hc := testserver.H2CClient()
	hc.Transport = &losingTransport{next: hc.Transport, lose: map[int]bool{2: true}}
	clk := &manualClock{now: time.Now().UTC()}
	logs := &countingHandler{}
	v := agentsdk.Version{Command: "sleep", Args: []string{"600"}}
	v1, v2 := v, v
	v1.Name, v2.Name = "v1", "v2"
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) {
		cfg.Operator = agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(hc))
		cfg.Labels, cfg.Clock, cfg.Log = map[string]string{"app": "lost"}, clk, slog.New(logs)
	})
	var first string
	testserver.WaitFor(t, 30*time.Second, "v1 to start", func() bool {
		first, _ = l.Current()
		return first != ""
	})
	drainForUpgrade(t, admin, first)
	testserver.WaitFor(t, 30*time.Second, "the launcher to fail to register v2", func() bool {
		return logs.count("launcher step failed; retrying") > 0
	})
	clk.advance(agentsdk.MinRestartBackoff)
	var current string
	testserver.WaitFor(t, 30*time.Second, "the launcher to start v2 on its retry", func() bool {
		var version string
		current, version = l.Current()
		return version == "v2"
	})
	resp, err := admin.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: "app=lost,version=v2", OneLevel: true}))
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, n := range resp.Msg.Nodes {
		if n.NodeId == current {
			continue
		}
		lost++
		if n.TerminationId == "" {
			t.Errorf("the root whose registration's answer was lost (%s) runs on with no process, no termination", n.NodeId)
		}
	}
	if lost != 1 {
		t.Errorf("%d v2 roots besides the running one, want the 1 whose answer was lost", lost)
	}
}

// openPty returns a new pseudo-terminal's master and its terminal.
func openPty(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("a pseudo-terminal: %v", err)
	}
	unlock := int32(0)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatal(errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatal(errno)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = m.Close() })
	return m, s
}

// TestRogue38HHelperAgent is not a test: it is the agent the rogue38h
// launcher process runs (this test binary, re-executed). It tries to type
// into its launcher's terminal (TIOCSTI on /dev/tty, its controlling
// terminal), writes what came of it to R38H_AGENT_OUT, then waits.
func TestRogue38HHelperAgent(t *testing.T) {
	out := os.Getenv("R38H_AGENT_OUT")
	if out == "" {
		t.Skip("By design: a helper process, not a test: the agent the rogue38h tests launch (this binary re-executed with R38H_AGENT_OUT set); it runs only there.")
	}
	result := "reached"
	fd, err := syscall.Open("/dev/tty", syscall.O_RDWR, 0)
	if err == nil {
		c := byte('#')
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSTI, uintptr(unsafe.Pointer(&c))); errno != 0 {
			result = "refused: TIOCSTI: " + errno.Error()
		}
	} else {
		result = "refused: open /dev/tty: " + err.Error()
	}
	_ = os.WriteFile(out+".tmp", []byte(result), 0o644)
	_ = os.Rename(out+".tmp", out)
	time.Sleep(time.Hour)
}

// TestRogue38HAnAgentCannotTypeIntoItsLaunchersTerminal: every agent ran
// in its launcher's session (a process group of its own, no more), so a
// launcher run from a terminal — an operator's shell, a tmux pane, an
// ssh session — shared it with its agents as their controlling terminal:
// any agent, whatever user it ran as (Version.RunAs), opened /dev/tty and
// pushed characters into the terminal's input (TIOCSTI, where the kernel
// still allows it): commands the operator's shell would run, as the
// operator, once the launcher stopped. Each agent starts in a session of
// its own, with no controlling terminal.
func TestRogue38HAnAgentCannotTypeIntoItsLaunchersTerminal(t *testing.T) {
	srv := testserver.Start(t)
	_, tty := openPty(t)
	out := filepath.Join(t.TempDir(), "probe")
	agentPrefix := os.Args[0] + " -test.run=^TestRogue38HHelperAgent$"
	killRunning(t, agentPrefix)
	var logs lockedBuffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestRogue38HHelperLauncher$")
	cmd.Env = append(os.Environ(), "R38H_LAUNCHER=1", "R38H_URL="+srv.URL, "R38H_TOKEN="+srv.Admin, "R38H_PROBE_OUT="+out)
	cmd.Stdin, cmd.Stderr = tty, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	probe := readWhenThere(t, "the agent to try its launcher's terminal", out)
	if !strings.HasPrefix(probe, "refused") {
		t.Errorf("an agent typed into its launcher's terminal (TIOCSTI on /dev/tty): %s", probe)
	}
}

// TestRogue38HAStateFileCannotHoldTheAgentBackForever: the state a
// launcher run finds is its predecessor's word, and whoever could write it
// (the launcher's user: an agent without a RunAs of its own, or a file
// damaged) could name any backoff: a pause of a thousand hours kept every
// later run from ever starting its agent. The pause before a first start
// is never more than MaxRestartBackoff, however long the state says.
func TestRogue38HAStateFileCannotHoldTheAgentBackForever(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	clk := &manualClock{now: time.Now().UTC()}
	state := `{"clean":false,"backoff":` + strconv.FormatInt(int64(1000*time.Hour), 10) + `,"last_start":"` + clk.Now().Format(time.RFC3339Nano) + `"}`
	if err := os.WriteFile(filepath.Join(dir, "host-1.held.state"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	v := agentsdk.Version{Command: "sleep", Args: []string{"600"}}
	v1, v2 := v, v
	v1.Name, v2.Name = "v1", "v2"
	l := runLauncher(t, srv, []agentsdk.Version{v1, v2}, func(cfg *agentsdk.LauncherConfig) {
		cfg.Instance, cfg.StateDir, cfg.Clock = "host-1.held", dir, clk
		cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	})
	testserver.WaitFor(t, 30*time.Second, "the launcher to wait before its first start", func() bool {
		return strings.Contains(logs.String(), "waiting before starting the agent")
	})
	clk.advance(agentsdk.MaxRestartBackoff)
	testserver.WaitFor(t, 30*time.Second, "the launcher to start its agent once MaxRestartBackoff has passed", func() bool {
		node, _ := l.Current()
		return node != ""
	})
}
