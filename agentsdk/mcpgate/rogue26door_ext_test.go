package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
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

// The twenty-sixth rogue pass against the MCP gateway's HTTP door: the
// agent whose grant was revoked (or whose node was terminated, which
// revokes its subtree's grants).

// A revoked token does not get past the gateway's HTTP door. The door
// checked only the token's signature and expiry (Identify): once the
// gateway's verifier had the tombstone, the rogue's tools/list and
// tools/call were refused, but its ping on the session it held went on
// being answered — keeping that session, and the connection, alive — and
// it could open new sessions (up to its per-node bounds) until its token
// expired. Now every request whose token the verifier knows revoked is
// refused at the door, HTTP 403 with a JSON-RPC error (CodeDenied, saying
// the grant is revoked, never the token), and its connection closed.
// (Fails if the ping, the new session or the raw request is admitted.)
func TestRogue26DoorARevokedTokenIsRefusedAtTheDoor(t *testing.T) {
	t.Run("revoked", func(t *testing.T) {
		refusedAtTheDoor(t, func(w *world) {
			if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("terminated", func(t *testing.T) {
		refusedAtTheDoor(t, func(w *world) {
			// Abort with nothing in flight: the subtree's grants are revoked
			// once no acknowledgement is pending (reconciling is after that).
			term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
			waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
		})
	})
}

// refusedAtTheDoor opens a session with the agent's token, has stop end
// its grant, and checks the door refuses the token from then on.
func refusedAtTheDoor(t *testing.T, stop func(w *world)) {
	w := newWorld(t, "mcp:test/*")
	cs := connectAgent(t, w.endpoint, w.grant.Token, nil)
	if err := cs.Ping(context.Background(), nil); err != nil {
		t.Fatalf("ping before the revocation: %v", err)
	}
	stop(w)
	// The event: the gateway's view of the token turns revoked.
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := w.gw.Verifier().Verify(context.Background(), w.grant.Token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})

	// The session it holds: its ping is refused.
	err := cs.Ping(context.Background(), nil)
	if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("ping on the rogue's session after the revocation: %v; want code %d (revoked)", err, mcpgate.CodeDenied)
	}
	// A new session: refused.
	client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
	hc := &http.Client{Transport: bearer{token: func() string { return w.grant.Token }, next: http.DefaultTransport}}
	if cs2, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc}, nil); err == nil {
		_ = cs2.Close()
		t.Errorf("a new session with the revoked token was opened; want it refused")
	} else if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("a new session with the revoked token: %v; want code %d (revoked)", err, mcpgate.CodeDenied)
	}
	// The raw answer: 403, a JSON-RPC error, the connection closed, the
	// token nowhere.
	req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.grant.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "revoked") || !strings.Contains(string(body), `"jsonrpc"`) {
		t.Errorf("a request with the revoked token: %d %s; want 403 with a JSON-RPC error saying the grant is revoked", resp.StatusCode, body)
	}
	if !resp.Close {
		t.Errorf("the connection of a request with the revoked token was kept open; want it closed")
	}
	if strings.Contains(string(body), w.grant.Token) {
		t.Errorf("the refusal quotes the token")
	}
	if n := w.events.Calls("echo"); n != 0 {
		t.Errorf("the upstream saw %d calls, want none", n)
	}
}
