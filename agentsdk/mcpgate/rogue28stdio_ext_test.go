package mcpgate_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A revoked or terminated agent behind `tether mcp wrap` (the gateway on
// its stdio, its token from a file it may rewrite) has its request
// refused once the gateway's verifier knows, and none reaches the
// upstream. Since the twenty-ninth pass its stdio session is ended too
// (rogue29b tests): the first request to find the revocation (the
// gateway's pass over its sessions is held here) is refused, and the
// session ends, ServeStdio returning the revocation. (A guard: it fails if
// a call or a listing of the revoked agent is served.)
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
		for _, first := range []string{"call", "listing"} {
			t.Run(c.name+", "+first, func(t *testing.T) {
				w := newWorld(t, "mcp:test/*")
				gw := gatewayWithHeldScan(t, w)
				a := serveStdioAgent(t, gw, w.grant.Token)
				if got, err := callText(t, a.cs, "echo", map[string]any{"text": "before"}); err != nil || got != "before" {
					t.Fatalf("a call before the stop: %q, %v", got, err)
				}
				before := w.events.Calls("echo")

				c.stop(t, w)
				testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
					_, err := gw.Verifier().Verify(context.Background(), w.grant.Token)
					return errors.Is(err, capability.ErrGrantRevoked)
				})
				// The agent rewrites its token file (the same token, a new
				// modification): it is read again, and refused again.
				if err := os.WriteFile(a.file, []byte(w.grant.Token+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				var err error
				switch first {
				case "call":
					_, err = callText(t, a.cs, "echo", map[string]any{"text": "after"})
				case "listing":
					_, err = a.cs.ListTools(context.Background(), nil)
				}
				if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
					t.Errorf("the %s after the stop: %v; want it refused (%d, revoked)", first, err, mcpgate.CodeDenied)
				}
				if err := recv(t, a.served, "ServeStdio to return"); !errors.Is(err, capability.ErrGrantRevoked) {
					t.Errorf("ServeStdio returned %v; want the revocation (the session ended)", err)
				}
				if _, err := callText(t, a.cs, "echo", map[string]any{"text": "after the end"}); err == nil {
					t.Error("a call on the ended stdio session was answered")
				}
				if n := w.events.Calls("echo") - before; n != 0 {
					t.Errorf("the upstream ran %d calls of the stopped agent; want none", n)
				}
			})
		}
	}
}
