//go:build linux

package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth rogue pass against the MCP gateway (helper H): a rogue
// stdio upstream and the control plane's cancel.

// runsOnPastCancel is a rogue stdio upstream with one tool, put: it takes
// a call (file started), notes the gateway's notifications/cancelled of it
// (file cancelled) and goes on with it regardless, answering it with a
// result once the file release exists. Its input's end exits it.
func runsOnPastCancel(dir string) {
	in := bufio.NewReader(os.Stdin)
	send := answerHandshake(in, "runs-on", "put")
	lines := make(chan []byte)
	go func() {
		for {
			line, err := in.ReadBytes('\n')
			if err != nil {
				os.Exit(0)
			}
			lines <- line
		}
	}()
	var call json.RawMessage
	tick := time.NewTicker(5 * time.Millisecond)
	for {
		select {
		case line := <-lines:
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			_ = json.Unmarshal(line, &m)
			switch {
			case m.Method == "tools/call" && m.ID != nil:
				call = m.ID
				_ = os.WriteFile(filepath.Join(dir, "started"), nil, 0o600)
			case m.Method == "notifications/cancelled":
				_ = os.WriteFile(filepath.Join(dir, "cancelled"), line, 0o600)
			case m.ID != nil:
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{}})
			}
		case <-tick.C:
			if call == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
				send(map[string]any{"jsonrpc": "2.0", "id": call, "result": map[string]any{
					"content": []any{map[string]any{"type": "text", "text": "done all the same"}}}})
				call = nil
			}
		}
	}
}

// runsOnWorld is a world whose gateway, on the manual clock clk, fronts
// the rogue upstream runsOnPastCancel (upstream "runs", its files in dir),
// with an agent's MCP session on it over Streamable HTTP and its call to
// runs/put under way at the upstream.
func runsOnWorld(t *testing.T) (w *world, clk *clock.Manual, dir string, called <-chan error) {
	t.Helper()
	w = newWorld(t, "mcp:runs/*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	clk = clock.NewManual(time.Now().UTC())
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP, Clock: clk,
		Upstreams: []mcpgate.Upstream{{Name: "runs", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE44H_RUNS_ON": dir}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cs := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}})
		done <- err
	}()
	testserver.WaitFor(t, guardWait, "the upstream to take the call", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the agent's call ended before the upstream took it: %v", err)
		default:
		}
		return exists(dir, "started")()
	})
	return w, clk, dir, done
}

func exists(dir, name string) func() bool {
	return func() bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
}

// abortRecord aborts the world's agent, waits for its upstream to hear
// the call's cancel, runs then (the upstream has heard it, the gateway is
// waiting), and returns the record's one call of runs/put.
func abortRecord(t *testing.T, w *world, dir string, then func()) *tetherv1.RecordToolCall {
	t.Helper()
	return abortRecordAfter(t, w, func() {
		testserver.WaitFor(t, guardWait, "the upstream to hear the call cancelled", exists(dir, "cancelled"))
	}, then)
}

// A rogue stdio upstream that ignores notifications/cancelled and answers
// the call with a result after its cancel cannot have the record say the
// call stopped on its cancel. The Go SDK's client forgets a call as its
// context is cancelled (the gateway acknowledged the cancel at once) and
// drops the answer that comes after: the record read cancelled_acked, the
// gateway's word that the call stopped, of a call the upstream ran to its
// end, and the agent was told its call was cancelled. The gateway now
// listens for the upstream's answer for mcpgate.CancelAnswerGrace after the
// cancel: an answer with a result is recorded completed, as the Go
// ToolGate records a handler that returned a result after the order.
// (Fails, before that, with the call cancelled_acked.)
func TestRogue44HStdioUpstreamThatRunsOnPastItsCancelIsNotRecordedCancelled(t *testing.T) {
	w, _, dir, called := runsOnWorld(t)
	call := abortRecord(t, w, dir, func() {
		// The gateway's clock stands still: the grace is not over.
		if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
		t.Fatalf("record: runs/put %v (%q), want completed: the upstream answered it with a result after its cancel", call.Resolution, call.Error)
	}
	if err := recv(t, called, "the agent's call"); rpcCode(err) == mcpgate.CodeCancelled {
		t.Fatalf("the agent was told its call was cancelled (%v): the upstream ran it", err)
	}
}

// An upstream that says nothing more of a call once cancelled (MCP's
// advice to one that stops) has the cancel acknowledged when the grace is
// over: the gateway's wait for a late answer costs an abort
// mcpgate.CancelAnswerGrace of the gateway's clock at most.
func TestRogue44HStdioUpstreamSilentAfterItsCancelIsAcknowledgedAfterTheGrace(t *testing.T) {
	w, clk, dir, called := runsOnWorld(t)
	wantAcked(t, abortRecord(t, w, dir, func() { passGrace(t, clk) }), called)
}
