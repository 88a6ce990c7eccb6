//go:build linux

package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestMain lets this test binary be the rogue stdio upstreams below and
// in rogue21exits, rogue38e, rogue39e and rogue43t.
func TestMain(m *testing.M) {
	if dir := os.Getenv("MCPGATE_ROGUE39E_WORKS"); dir != "" {
		worksOn()
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE39E_FORKS"); dir != "" {
		forksItsWork(dir)
		return
	}
	if marker := os.Getenv("MCPGATE_ROGUE20_STOPS_READING"); marker != "" {
		stopsReading(marker)
		return
	}
	if marker := os.Getenv("MCPGATE_ROGUE37E_PINGS"); marker != "" {
		pingsAndStopsReading(marker)
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE38E_LINGERS"); dir != "" {
		lingersTogether(dir)
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE38E_HOLDS"); dir != "" {
		holdsUntilReleased(dir)
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE43T_OUTLIVES"); dir != "" {
		outlivesItsWrapper(dir)
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE44H_RUNS_ON"); dir != "" {
		runsOnPastCancel(dir)
		return
	}
	if dir := os.Getenv("MCPGATE_ROGUE21_EXITS"); dir != "" {
		exitsOnceListed(dir)
		return
	}
	os.Exit(m.Run())
}

// stopsReading is a rogue stdio upstream: it answers the gateway's
// handshake and its listing of one tool, put, then reads nothing more from
// its input and never exits on its own. Once its input pipe is full (the
// gateway is blocked writing to it) it creates the file marker.
func stopsReading(marker string) {
	answerHandshake(bufio.NewReader(os.Stdin), "stops-reading", "put")
	stayOnceInputFull(marker)
}

// answerHandshake is a hand-written stdio upstream's side of the
// gateway's handshake: it answers initialize as the server name, the
// listing with one tool, and any other request "method not found", until
// the listing is answered. Its input ending exits the process (1). It
// returns how to send a message.
func answerHandshake(in *bufio.Reader, name, tool string) (send func(map[string]any)) {
	send = func(m map[string]any) {
		b, _ := json.Marshal(m)
		_, _ = os.Stdout.Write(append(b, '\n'))
	}
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			os.Exit(1)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"params"`
		}
		if json.Unmarshal(line, &m) != nil || m.ID == nil {
			continue
		}
		switch m.Method {
		case "initialize":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"protocolVersion": m.Params.ProtocolVersion,
				"capabilities": map[string]any{"tools": map[string]any{}}, "serverInfo": map[string]any{"name": name, "version": "1"}}})
		case "tools/list":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"tools": []any{
				map[string]any{"name": tool, "inputSchema": map[string]any{"type": "object"}}}}})
			return send
		default:
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
		}
	}
}

// stayOnceInputFull reads nothing more from the process's input and
// never exits; once its input pipe is full (the gateway is blocked
// writing to it) it creates the file marker.
func stayOnceInputFull(marker string) {
	for {
		var n int32
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e == 0 && n >= 60<<10 {
			_ = os.WriteFile(marker, nil, 0o600)
			select {} // and stays
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A rogue stdio upstream cannot hang an abort by no longer reading its
// input. The Go SDK writes a request to a stdio upstream without regard to
// the call's context: a call whose request did not fit in the pipe of an
// upstream that stopped reading was blocked in that write, and the
// control plane's cancel did not end it. The gateway never acknowledged
// the cancel (the termination waited for its acknowledgement deadline and
// recorded the call cancel_unacknowledged, as if the gateway had died),
// the agent's call was never answered, and it held its place in the
// node's calls in flight. A write the call's cancel overtakes now ends the
// connection (the rest of the request is never written, and the upstream
// is stopped and started again): the gateway acknowledges the cancel and
// the agent is told its call was cancelled.
func TestARogueStdioUpstreamThatStopsReadingCannotHangAnAbort(t *testing.T) {
	w := newWorld(t, "mcp:stops/*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "full")
	gw := w.open(t, mcpgate.Upstream{Name: "stops", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE20_STOPS_READING": marker}})
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	ctx, leave := context.WithCancel(context.Background())
	t.Cleanup(leave) // before the agent's session closes, should the test fail
	done := make(chan error, 1)
	go func() {
		// 1 MiB of arguments: far more than the upstream's input pipe holds.
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "put", Arguments: map[string]any{"blob": strings.Repeat("x", 1<<20)}})
		done <- err
	}()
	testserver.WaitFor(t, guardWait, "the gateway to be blocked writing the call to the upstream", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
	if err != nil || len(calls.Msg.Calls) != 1 {
		t.Fatalf("the node's open calls while the write is blocked: %v, %v; want the one call", calls, err)
	}

	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	// The clock is manual: the acknowledgement deadline never passes, so the
	// abort reconciles only once the gateway acknowledged.
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	if err := recv(t, done, "done"); rpcCode(err) != mcpgate.CodeCancelled {
		t.Fatalf("the agent's call ended with %v, want code %d", err, mcpgate.CodeCancelled)
	}
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls2 := callsByTool(t, recordOf(t, w, term.TerminationId))
	if len(calls2["stops/put"]) != 1 || calls2["stops/put"][0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: %v, want the call cancelled_acked by the gateway", calls2)
	}
}
