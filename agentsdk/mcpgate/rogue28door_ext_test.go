package mcpgate_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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

// The twenty-eighth rogue pass against the MCP gateway: the agent whose
// grant was revoked (or whose node was terminated), at the HTTP door.

// revokeAndWait revokes the world's grant and waits for the gateway's
// verifier to know it.
func revokeAndWait(t *testing.T, w *world) {
	t.Helper()
	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "rogue"})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := w.gw.Verifier().Verify(context.Background(), w.grant.Token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})
}

// A revoked agent cannot have the gateway hold its request bodies whole.
// The door refuses a revoked token's every request, answering under the
// request's JSON-RPC id, and to find that id it read the body whole, up to
// the SDK's limit (4 MiB), before answering: the refused request is
// counted against no node (neither its connections nor its calls), so a
// revoked rogue sending bodies of 4 MiB, the last byte held back, had the
// gateway hold 4 MiB for each connection it opened, as many as it opened —
// where a client without a token, refused by the bearer, has no byte of
// its body read. The door now reads at most mcpgate.MaxRefusedBodyBytes
// of a refused body to find its id, and answers without the rest. (Fails,
// by its guard, if the refusal waits for the body's end.)
func TestRogue28ARevokedAgentCannotHaveTheDoorHoldItsBodiesWhole(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	revokeAndWait(t, w)
	u, err := url.Parse(w.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name, head string
		wantID     string
	}{
		// The Go and Python SDKs write the id before the params: found.
		{"id first", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`, `"id":7`},
		// The TypeScript SDK writes it last: past the part read, null.
		{"id last", `{"method":"tools/call","params":{"name":"echo","arguments":{"text":"`, `"id":null`},
	} {
		t.Run(p.name, func(t *testing.T) {
			c, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			_ = c.SetDeadline(time.Now().Add(guardWait)) // a guard against a hang, not a timing
			const length = mcp.DefaultMaxRequestBodyBytes - 16
			// The body but for its end: the rest never comes.
			sent := p.head + strings.Repeat("x", 2*mcpgate.MaxRefusedBodyBytes)
			if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
				u.Path, u.Host, w.grant.Token, length, sent); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer to the revoked request before its body ended: %v; want it refused at once", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "revoked") || !strings.Contains(string(body), p.wantID) {
				t.Errorf("the revoked request: %d %.300s; want 403 saying the grant is revoked, under %s", resp.StatusCode, body, p.wantID)
			}
			if !resp.Close {
				t.Errorf("the connection of the revoked request was kept open; want it closed")
			}
		})
	}
}
