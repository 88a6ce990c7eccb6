package mcpgate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// The thirtieth rogue pass against the MCP gateway (helper A): the agent
// being stopped, behind `tether mcp wrap` or the HTTP endpoint.

// rawStdio is an agent writing raw lines to gw's stdio (ServeStdio with
// tokens), its answers read line by line.
type rawStdio struct {
	out    io.WriteCloser
	lines  *bufio.Reader
	served chan error
}

func serveRawStdio(t *testing.T, gw *mcpgate.Gateway, tokens mcpgate.TokenSource) *rawStdio {
	t.Helper()
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	a := &rawStdio{out: agentOut, lines: bufio.NewReader(agentIn), served: make(chan error, 1)}
	go func() { a.served <- gw.ServeStdio(ctx, tokens, toGateway, fromGateway) }()
	t.Cleanup(func() {
		cancel()
		agentOut.Close()
		agentIn.Close()
	})
	return a
}

func (a *rawStdio) send(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(a.out, msg+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (a *rawStdio) read(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		line, err := a.lines.ReadString('\n')
		if err != nil {
			line = "the gateway's output ended: " + err.Error()
		}
		got <- line
	}()
	return within(t, got, "the gateway's answer")
}

// A revoked agent's JSON-RPC batch over stdio is its token at work as any
// request is: refused as revoked, reported to the control plane (the node
// seen after its session's end) and its session ended. The batch was
// answered -32600 before any look at the token, and nothing told the
// control plane: a revoked rogue kept its stdio session, and showed no
// life, by sending only batches. (Fails if the batch is answered anything
// but the revocation, or goes unreported, or the session goes on.)
func TestRogue30AStdioBatchOfARevokedAgentIsRefusedReportedAndEndsItsSession(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	gw := gatewayWithHeldScan(t, w)
	a := serveRawStdio(t, gw, mcpgate.StaticToken(w.grant.Token))
	a.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`)
	if line := a.read(t); !strings.Contains(line, `"id":1`) || strings.Contains(line, "error") {
		t.Fatalf("initialize: %s", line)
	}
	a.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	self := w.agent.Node.NodeId
	endSession(t, w, self)
	revokeAndWaitOn(t, w, gw)

	a.send(t, `[{"jsonrpc":"2.0","id":2,"method":"ping"}]`)
	var refusal struct {
		Error struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	line := a.read(t)
	if err := json.Unmarshal([]byte(line), &refusal); err != nil || refusal.Error.Code != mcpgate.CodeDenied || !strings.Contains(refusal.Error.Message, "revoked") {
		t.Fatalf("the revoked agent's batch over stdio: %.400s; want it refused (%d, revoked)", line, mcpgate.CodeDenied)
	}
	if err := recv(t, a.served, "ServeStdio to return: the revoked agent's stdio session ended"); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("ServeStdio returned %v; want the revocation", err)
	}
	testserver.WaitFor(t, guardWait, "the control plane to see the rogue at work after its session's end", func() bool {
		n := nodeOf(t, w, self)
		return n.LastSeenAt != nil && n.LastSeenAt.AsTime().After(n.SessionClosedAt.AsTime())
	})
}
