//go:build linux

package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-ninth rogue pass against the MCP gateway (helper E).

// forksItsWork is a rogue stdio upstream: it answers the gateway's
// handshake and its listing of one tool, and hands each call to a worker
// process of its own (this binary again, worksOn), answering nothing: the
// call stays in flight. The worker's pid is written to the file pid in
// dir. At its input's end the upstream exits at once, as an honest one
// does, leaving its worker behind; with MCPGATE_ROGUE39E_CRASHES set it
// exits as soon as the worker has started, a crash as far as the gateway
// can tell.
func forksItsWork(dir string) {
	in := bufio.NewReader(os.Stdin)
	answerHandshake(in, "forks", "put")
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			os.Exit(0)
		}
		var m struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(line, &m) != nil || m.Method != "tools/call" {
			continue
		}
		worker := exec.Command(os.Args[0])
		worker.Env = append(os.Environ(), "MCPGATE_ROGUE39E_FORKS=", "MCPGATE_ROGUE39E_CRASHES=", "MCPGATE_ROGUE40E_SETSID=", "MCPGATE_ROGUE39E_WORKS="+dir)
		if os.Getenv("MCPGATE_ROGUE40E_SETSID") != "" {
			// Out of the upstream's process group, as a daemon leaves it.
			worker.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		if worker.Start() != nil {
			os.Exit(1)
		}
		_ = os.WriteFile(filepath.Join(dir, "pid.tmp"), []byte(strconv.Itoa(worker.Process.Pid)), 0o600)
		_ = os.Rename(filepath.Join(dir, "pid.tmp"), filepath.Join(dir, "pid"))
		if os.Getenv("MCPGATE_ROGUE39E_CRASHES") != "" {
			os.Exit(2)
		}
	}
}

// worksOn is forksItsWork's worker: it works on for ever (until killed).
func worksOn() {
	for {
		time.Sleep(time.Hour)
	}
}

// alive reports whether process pid is there and not a zombie (killed,
// its exit not yet collected by whoever inherited it).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(stat)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(rest) > 0 && rest[0] != "Z" && rest[0] != "X"
}

// A rogue stdio upstream cannot go on with a call, in a process of its
// own, once the gateway has recorded the call ended with the upstream
// gone. The gateway's Close records a call it abandons as it closes ended
// (failed, in its words) once the upstream's process is gone, as the
// process may go on with the call until then; an upstream that handed the
// call to a worker process, and exited at its input's end as an honest
// one does, left the worker doing the call's work after the gateway had
// recorded it ended, and after `tether mcp serve` had exited. A stdio
// upstream now runs as the leader of a process group of its own, and
// what is left of the group is killed once its process has gone, before
// the calls are recorded ended. (Fails, before that, because the worker
// is still there once Close has returned and the call is recorded
// ended.)
func TestRogue39EStdioUpstreamsWorkerDoesNotOutliveTheRecordedCall(t *testing.T) {
	workerDoesNotOutliveTheRecordedCall(t, false)
}

// workerDoesNotOutliveTheRecordedCall has an agent call the forking
// upstream's tool (its worker in a session of its own if setsid), closes
// the gateway, and wants the call recorded ended once Close has returned
// and the upstream's worker gone.
func workerDoesNotOutliveTheRecordedCall(t *testing.T, setsid bool) {
	t.Helper()
	w, gw, endpoint, dir := forkingUpstreamGateway(t, false, setsid)

	cs := connectAgent(t, endpoint, w.grant.Token, nil)
	callCtx, leave := context.WithCancel(context.Background())
	t.Cleanup(leave)
	answered := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}})
		answered <- err
	}()
	openCalls := func() int {
		calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		open := 0
		for _, c := range calls.Msg.Calls {
			if c.GetState() != tetherv1.CallState_CALL_STATE_ENDED {
				open++
			}
		}
		return open
	}
	var pid int
	testserver.WaitFor(t, guardWait, "the call to be begun and handed to the upstream's worker", func() bool {
		select {
		case err := <-answered:
			t.Fatalf("the call the upstream never answers was answered: %v", err)
		default:
		}
		b, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err != nil {
			return false
		}
		pid, _ = strconv.Atoi(string(b))
		return pid > 0 && openCalls() == 1
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	if !alive(pid) {
		t.Fatalf("the upstream's worker %d is not running before the gateway closes", pid)
	}

	closeReturns(t, gw, "the gateway's Close")
	if got := openCalls(); got != 0 {
		t.Fatalf("the call abandoned at the gateway's close is still open in the ledger once Close returned (%d open)", got)
	}
	// Killed before the call was recorded ended, and reaped (the gateway's
	// process adopted it as a subreaper) before Close returned.
	if alive(pid) {
		t.Fatalf("the upstream's worker %d still runs once the gateway's Close has returned, the call recorded ended", pid)
	}
}

// The same when the upstream's process ends mid-call: a rogue stdio
// upstream that handed a call to a worker process and exited (a crash,
// to the gateway) had the call fail (CodeUnavailable) and recorded
// ended, and the gateway start it again, while the worker went on with
// the call's work. What is left of the upstream's process group is now
// killed as its connection closes, before the gateway starts it again.
// (Fails, before that, because the worker is still there.)
func TestRogue39EStdioUpstreamsWorkerDoesNotOutliveItsCrash(t *testing.T) {
	workerDoesNotOutliveItsCrash(t, false)
}

// workerDoesNotOutliveItsCrash has an agent call the forking upstream
// that exits mid-call (its worker in a session of its own if setsid), and
// wants the call failed and the upstream's worker gone.
func workerDoesNotOutliveItsCrash(t *testing.T, setsid bool) {
	t.Helper()
	w, _, endpoint, dir := forkingUpstreamGateway(t, true, setsid)

	cs := connectAgent(t, endpoint, w.grant.Token, nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}})
	if rpcCode(err) != mcpgate.CodeUnavailable {
		t.Fatalf("the call whose upstream exited mid-call: %v; want CodeUnavailable", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatalf("the upstream started no worker: %v", err)
	}
	pid, _ := strconv.Atoi(string(b))
	if pid <= 0 {
		t.Fatalf("the worker's pid file holds %q", b)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	testserver.WaitFor(t, guardWait, "the crashed upstream's worker to be gone", func() bool { return !alive(pid) })
}

// forkingUpstreamGateway starts a gateway whose one stdio upstream
// ("forks") is this test binary run again as the rogue upstream that
// hands its calls to a worker process, writing the worker's pid in dir;
// crashes, it exits mid-call; setsid, its worker leaves its process group
// (and session).
func forkingUpstreamGateway(t *testing.T, crashes, setsid bool) (w *world, gw *mcpgate.Gateway, endpoint, dir string) {
	t.Helper()
	w = newWorld(t, "mcp:*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	env := map[string]string{"MCPGATE_ROGUE39E_FORKS": dir}
	if crashes {
		env["MCPGATE_ROGUE39E_CRASHES"] = "1"
	}
	if setsid {
		env["MCPGATE_ROGUE40E_SETSID"] = "1"
	}
	gw = gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "forks", Command: []string{exe}, Env: env}}
	})
	return w, gw, serveGateway(t, gw), dir
}
