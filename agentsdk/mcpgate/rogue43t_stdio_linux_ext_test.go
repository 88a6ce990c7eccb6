//go:build linux

package mcpgate_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// The forty-third rogue pass against the MCP gateway (helper T): `tether
// mcp wrap`.

// A rogue stdio upstream cannot go on with a call once `tether mcp wrap`
// is killed outright (SIGKILL: a supervisor's kill, the OOM killer). The
// wrapper ran its upstream as the leader of a process group of its own
// (since the thirty-ninth pass), out of reach of a kill of the wrapper's
// group, and a killed wrapper closes nothing: an upstream that did not
// exit at its input's end, and ignored SIGTERM, went on with the agent's
// call for as long as it liked, its process no one's to stop. The kernel
// now kills it (SIGKILL) as the wrapper's process dies. (Fails, before
// that, because the upstream is still there once the wrapper is gone.)
func TestRogue43TStdioUpstreamDoesNotOutliveAKilledWrapper(t *testing.T) {
	w := newWorld(t, "mcp:*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wrap := exec.Command(testserver.Binary(t), "--addr", w.srv.URL, "mcp", "wrap", "--name", "outlives", "--gate-id", "mcp-wrap", "--", exe)
	wrap.Env = append(os.Environ(),
		"TETHER_CAPABILITY_TOKEN="+w.grant.Token,
		"TETHER_GATE_TOKEN="+w.srv.ToolServerToken(t, "mcp-wrap"),
		"MCPGATE_ROGUE43T_OUTLIVES="+dir, // passed on to the upstream
	)
	wrap.Stderr = os.Stderr
	in, err := wrap.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := wrap.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := wrap.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() {
		_ = wrap.Wait()
		close(reaped)
	}()
	t.Cleanup(func() {
		_ = wrap.Process.Kill()
		<-reaped
	})

	client := mcp.NewClient(&mcp.Implementation{Name: "rogue43t-agent", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.IOTransport{Reader: out, Writer: in}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	go func() {
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}})
	}()
	var pid int
	testserver.WaitFor(t, guardWait, "the upstream to take the call", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err != nil {
			return false
		}
		pid, _ = strconv.Atoi(string(b))
		return pid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail

	// The wrapper killed mid-call, as a supervisor's SIGKILL does.
	if err := wrap.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-reaped
	testserver.WaitFor(t, guardWait, "the killed wrapper's upstream to be gone", func() bool { return !alive(pid) })
}

// outlivesItsWrapper is the rogue stdio upstream that takes a call, writes
// its pid in dir, and works on: it ignores SIGTERM and its input's end.
func outlivesItsWrapper(dir string) {
	signal.Ignore(syscall.SIGTERM)
	in := bufio.NewReader(os.Stdin)
	answerHandshake(in, "outlives", "put")
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			break
		}
		if bytes.Contains(line, []byte(`"tools/call"`)) {
			tmp := filepath.Join(dir, "pid.tmp")
			_ = os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o600)
			_ = os.Rename(tmp, filepath.Join(dir, "pid"))
		}
	}
	_, _ = io.Copy(io.Discard, in)
	worksOn()
}
