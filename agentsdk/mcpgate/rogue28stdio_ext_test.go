package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A revoked or terminated agent behind `tether mcp wrap` (the gateway on
// its stdio, its token from a file it may rewrite) has every tool call and
// listing refused once the gateway's verifier knows, and none reaches the
// upstream: a stdio session is the agent's own process and is not ended
// (design §11), so each request must be refused on its own. (A guard: it
// fails if a call or a listing of the revoked agent is served.)
func TestRogue28AStdioAgentsEveryCallIsRefusedAfterItsRevocation(t *testing.T) {
	for _, c := range []struct {
		name string
		stop func(t *testing.T, w *world)
	}{
		{"revoked", func(t *testing.T, w *world) {
			if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
				t.Fatal(err)
			}
		}},
		{"terminated", func(t *testing.T, w *world) {
			term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
			waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, "mcp:test/*")
			file := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(file, []byte(w.grant.Token), 0o600); err != nil {
				t.Fatal(err)
			}
			toGateway, agentOut := io.Pipe()
			agentIn, fromGateway := io.Pipe()
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- w.gw.ServeStdio(ctx, &mcpgate.FileToken{Path: file}, toGateway, fromGateway) }()
			t.Cleanup(func() {
				cancel()
				agentOut.Close()
				agentIn.Close()
				recv(t, served, "ServeStdio to return")
			})
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-rogue"}, nil).Connect(ctx, &mcp.IOTransport{Reader: agentIn, Writer: agentOut}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got, err := callText(t, cs, "echo", map[string]any{"text": "before"}); err != nil || got != "before" {
				t.Fatalf("a call before the stop: %q, %v", got, err)
			}
			before := w.events.Calls("echo")

			c.stop(t, w)
			testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
				_, err := w.gw.Verifier().Verify(context.Background(), w.grant.Token)
				return errors.Is(err, capability.ErrGrantRevoked)
			})

			for i := range 3 {
				if i == 2 {
					// The agent rewrites its token file (the same token, a new
					// modification): it is read again, and refused again.
					if err := os.WriteFile(file, []byte(w.grant.Token+"\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := callText(t, cs, "echo", map[string]any{"text": "after"}); rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
					t.Errorf("call #%d after the stop: %v; want it refused (%d, revoked)", i+1, err, mcpgate.CodeDenied)
				}
				if _, err := cs.ListTools(context.Background(), nil); rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
					t.Errorf("listing #%d after the stop: %v; want it refused (%d, revoked)", i+1, err, mcpgate.CodeDenied)
				}
			}
			if n := w.events.Calls("echo") - before; n != 0 {
				t.Errorf("the upstream ran %d calls of the stopped agent; want none", n)
			}
		})
	}
}
