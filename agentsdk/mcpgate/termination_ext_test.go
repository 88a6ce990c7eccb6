package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// startSlow calls the slow tool with id in the background and returns once
// the upstream says the call started.
func startSlow(t *testing.T, cs *mcp.ClientSession, started <-chan struct{}, id string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": id}})
		if err == nil && res.Content[0].(*mcp.TextContent).Text != "finished "+id {
			err = errors.New("slow returned the wrong result")
		}
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("slow %s ended before it started upstream: %v", id, err)
	case <-time.After(guardWait): // a guard against a hang, not a timing
		t.Fatalf("slow %s neither started upstream nor ended within %s", id, guardWait)
	}
	return done
}

// While the agent drains, a new tools/call is refused with the reason, and
// the call in flight finishes; the record lists both, as the gateway
// reported them.
func TestDrainRefusesNewCallsWhileASlowCallFinishes(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	cs := connectAgent(t, w.endpoint, w.grant.Token, nil)
	done := startSlow(t, cs, w.events.Started("d"), "d")
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	_, err := callText(t, cs, "echo", map[string]any{"text": "new work"})
	if rpcCode(err) != mcpgate.CodeStopping || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("a new call while draining: %v, want code %d saying the node is draining", err, mcpgate.CodeStopping)
	}
	if n := w.events.Calls("echo"); n != 0 {
		t.Fatalf("the upstream saw %d echo calls during the drain", n)
	}
	w.events.Release("d")
	if err := recv(t, done, "done"); err != nil {
		t.Fatalf("the call in flight did not finish: %v", err)
	}
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))
	if len(calls["test/slow"]) != 1 || calls["test/slow"][0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
		t.Fatalf("record: slow %v, want one completed", calls["test/slow"])
	}
	if len(calls["test/echo"]) != 1 || calls["test/echo"][0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
		t.Fatalf("record: echo %v, want one rejected_draining", calls["test/echo"])
	}
}

// abortAndCheck aborts the agent with a slow call in flight, waits for the
// upstream to see the cancellation (cancelled), and checks the record: the
// call cancelled and acknowledged by the gateway.
func abortAndCheck(t *testing.T, w *world, tool string, done <-chan error, cancelled func() bool) {
	t.Helper()
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	testserver.WaitFor(t, guardWait, "the upstream to see the call cancelled", cancelled)
	if err := recv(t, done, "done"); rpcCode(err) != mcpgate.CodeCancelled {
		t.Fatalf("the agent's call ended with %v, want code %d", err, mcpgate.CodeCancelled)
	}
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))
	if len(calls) != 1 || len(calls[tool]) != 1 || calls[tool][0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: %v, want the slow call cancelled_acked by %s", calls, gateID)
	}
}

// Abort cancels a slow call upstream over Streamable HTTP.
func TestAbortCancelsASlowCallUpstreamOverHTTP(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	cs := connectAgent(t, w.endpoint, w.grant.Token, nil)
	done := startSlow(t, cs, w.events.Started("a"), "a")
	abortAndCheck(t, w, "test/slow", done, func() bool {
		select {
		case <-w.events.Cancelled("a"):
			return true
		default:
			return false
		}
	})
}

// Abort cancels a slow call upstream over stdio (notifications/cancelled
// to examples/mcpserver, a separate process), with the agent on the stdio
// side of the gateway too.
func TestAbortCancelsASlowCallUpstreamOverStdio(t *testing.T) {
	w := newWorld(t, "mcp:stdio/*")
	bin := filepath.Join(t.TempDir(), "mcpserver")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tetherhq/tether/examples/mcpserver").CombinedOutput(); err != nil {
		t.Fatalf("build examples/mcpserver: %v\n%s", err, out)
	}
	events := t.TempDir()
	gw := w.open(t, mcpgate.Upstream{Name: "stdio", Command: []string{bin, "--events", events}})

	// The agent speaks stdio to the gateway, as under `tether mcp wrap`.
	toGateway, agentOut := io.Pipe()
	agentIn, fromGateway := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- gw.ServeStdio(ctx, mcpgate.StaticToken(w.grant.Token), toGateway, fromGateway) }()
	t.Cleanup(func() {
		cancel()
		agentOut.Close()
		// The abort revoked the agent's grant: the gateway ended its
		// stdio session.
		if err := recv(t, served, "served"); err != nil && !errors.Is(err, capability.ErrGrantRevoked) {
			t.Errorf("ServeStdio: %v", err)
		}
	})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-agent"}, nil).Connect(ctx, &mcp.IOTransport{Reader: agentIn, Writer: agentOut}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	exists := func(name string) func() bool {
		return func() bool { _, err := os.Stat(filepath.Join(events, name)); return err == nil }
	}
	started := make(chan struct{})
	go func() {
		// The upstream is another process: its event is a file.
		for !exists("s.started")() {
			select {
			case <-t.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		close(started)
	}()
	done := startSlow(t, cs, started, "s")
	abortAndCheck(t, w, "stdio/slow", done, exists("s.cancelled"))
}
