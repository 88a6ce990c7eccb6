package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
)

// The twenty-first rogue pass against the gateway: upstreams slow to
// start or telling it their tools changed without end, and a rogue agent
// batching its requests on stdio.

// within waits for ch, failing the test if it does not come: what it
// waits for never comes on the code the test was written against.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guardWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// A rogue agent cannot send a JSON-RPC batch through the gateway on
// stdio. Over HTTP the gateway refuses batches (rogue9 test); under `tether
// mcp wrap` the SDK's stdio server took a batch from a session that
// negotiated 2025-03-26 — its requests each run at once and their answers
// held until the last was ready (a batch of tools/list, which stdio does
// not count against the calls in flight, held as many tool lists as fit in
// a 16 MiB line) — and ended the whole session on one from a later
// revision. A batch is now answered with the HTTP endpoint's error, none of
// it runs, and the session goes on, whatever its revision.
func TestARogueCannotSendAJSONRPCBatchThroughTheStdioGateway(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	for _, version := range []string{"2025-03-26", "2025-06-18"} {
		t.Run(version, func(t *testing.T) {
			gw := w.open(t, mcpgate.Upstream{Name: "test", URL: w.upstream})
			toGateway, agentOut := io.Pipe()
			agentIn, fromGateway := io.Pipe()
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- gw.ServeStdio(ctx, mcpgate.StaticToken(w.grant.Token), toGateway, fromGateway) }()
			t.Cleanup(func() {
				cancel()
				agentOut.Close()
				agentIn.Close()
				recv(t, served, "ServeStdio to return once its context ended and the agent hung up")
			})
			lines := bufio.NewReader(agentIn)
			send := func(msg string) {
				t.Helper()
				if _, err := io.WriteString(agentOut, msg+"\n"); err != nil {
					t.Fatal(err)
				}
			}
			read := func() string {
				t.Helper()
				got := make(chan string, 1)
				go func() {
					line, err := lines.ReadString('\n')
					if err != nil {
						line = "the gateway's output ended: " + err.Error()
					}
					got <- line
				}()
				return within(t, got, "the gateway's answer")
			}
			send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
			if line := read(); !strings.Contains(line, version) {
				t.Fatalf("initialize at %s: %s", version, line)
			}
			send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
			before := w.events.Calls("echo")
			batch := []string{`{"jsonrpc":"2.0","id":9,"method":"resources/list"}`}
			for i := range 20 {
				batch = append(batch, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, 10+i))
			}
			send("[" + strings.Join(batch, ",") + "]")
			var refusal struct {
				ID    any `json:"id"`
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			line := read()
			if err := json.Unmarshal([]byte(line), &refusal); err != nil || refusal.Error.Code != -32600 || !strings.Contains(refusal.Error.Message, "batches are refused") {
				t.Errorf("a batch of a listing of resources and %d calls: %.600s; want it refused (-32600)", len(batch)-1, line)
			}
			send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"one"}}}`)
			if line := read(); !strings.Contains(line, `"one"`) || !strings.Contains(line, `"id":2`) {
				t.Fatalf("a single call after the batch: %.300s", line)
			}
			if n := w.events.Calls("echo") - before; n != 1 {
				t.Errorf("the upstream ran %d calls; want the single one only", n)
			}
		})
	}
}
