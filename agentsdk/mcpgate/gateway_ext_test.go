package mcpgate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// tools/list shows what the grant allows; a tool outside it is refused
// before the ledger or the upstream hears of it; calls and progress pass
// through unchanged.
func TestScopesFilterTheListAndRefuseCallsOutsideTheGrant(t *testing.T) {
	w := newWorld(t, "mcp:test/echo", "mcp:test/sl*")
	var mu sync.Mutex
	var progress []*mcp.ProgressNotificationParams
	progressed := make(chan struct{}, 8)
	cs := connectAgent(t, w.endpoint, w.grant.Token, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params)
			mu.Unlock()
			progressed <- struct{}{}
		},
	})
	if got, want := toolNames(t, cs), []string{"echo", "slow"}; !slices.Equal(got, want) {
		t.Fatalf("tools/list = %v, want %v (fail is not granted)", got, want)
	}
	if got, err := callText(t, cs, "echo", map[string]any{"text": "hello"}); err != nil || got != "hello" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	_, err := callText(t, cs, "fail", map[string]any{})
	if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), `"mcp:test/fail"`) {
		t.Fatalf("calling an ungranted tool: %v, want code %d naming the scope", err, mcpgate.CodeDenied)
	}
	if n := w.events.Calls("fail"); n != 0 {
		t.Fatalf("the upstream saw %d calls of a refused tool", n)
	}

	// Progress reaches the agent under its own token, unchanged.
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
			Meta: mcp.Meta{"progressToken": "agent-token-7"}, Name: "slow", Arguments: map[string]any{"id": "p"},
		})
		if err == nil && res.Content[0].(*mcp.TextContent).Text != "finished p" {
			err = errors.New("wrong result")
		}
		done <- err
	}()
	recv(t, w.events.Started("p"), "w.events.Started('p')")
	recv(t, progressed, "progressed") // relayed while the call is in flight
	w.events.Release("p")
	if err := recv(t, done, "done"); err != nil {
		t.Fatalf("slow: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(progress) != 1 || progress[0].ProgressToken != "agent-token-7" || progress[0].Message != "started p" || progress[0].Progress != 1 || progress[0].Total != 2 {
		t.Fatalf("progress seen by the agent: %+v", progress)
	}
}

// An upstream's isError result and resources are handled as documented.
func TestToolErrorsPassThroughAndResourcesAreRefused(t *testing.T) {
	w := newWorld(t, "mcp:*")
	cs := connectAgent(t, w.endpoint, w.grant.Token, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fail", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "fail does what it says") {
		t.Fatalf("fail = %+v, %v; want the upstream's isError result", res, err)
	}
	// The gateway does not advertise resources; a client that asks anyway
	// is refused (by the Go SDK's client itself, or by the gateway).
	if _, err := cs.ListResources(context.Background(), nil); rpcCode(err) != mcpgate.CodeNotGated {
		t.Fatalf("resources/list: %v, want method not found", err)
	}
}

// The HTTP endpoint: no bearer → 401 pointing at the protected-resource
// metadata; the metadata names the resource and the scopes.
func TestHTTPEndpointAsksForTheBearerAndServesResourceMetadata(t *testing.T) {
	w := newWorld(t, "mcp:test/echo")
	resp, err := http.Post(w.endpoint, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	challenge := resp.Header.Get("WWW-Authenticate")
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(challenge, mcpgate.MetadataPath) {
		t.Fatalf("no bearer: %d %q, want 401 with resource_metadata", resp.StatusCode, challenge)
	}
	base := strings.TrimSuffix(w.endpoint, mcpgate.EndpointPath)
	resp, err = http.Get(base + mcpgate.MetadataPath + mcpgate.EndpointPath)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"resource":"`+w.endpoint+`"`) || !strings.Contains(string(body), "mcp:test/slow") {
		t.Fatalf("metadata: %d %s", resp.StatusCode, body)
	}
}

// A revocation mid-session stops the next call, once the gateway's
// verifier has the tombstone (the feed's latency), without the upstream
// hearing of it.
func TestRevocationMidSessionStopsTheNextCall(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	cs := connectAgent(t, w.endpoint, w.grant.Token, nil)
	if _, err := callText(t, cs, "echo", map[string]any{"text": "before"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grant.Grant.GrantId}, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	// The event: the gateway's view of the token turns revoked.
	verifier := w.gw.Verifier()
	testserver.WaitFor(t, guardWait, "the revocation to reach the gateway", func() bool {
		_, err := verifier.Verify(context.Background(), w.grant.Token)
		return errors.Is(err, capability.ErrGrantRevoked)
	})
	_, err := callText(t, cs, "echo", map[string]any{"text": "after"})
	if rpcCode(err) != mcpgate.CodeDenied || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the call after the revocation: %v, want code %d (revoked)", err, mcpgate.CodeDenied)
	}
	if n := w.events.Calls("echo"); n != 1 {
		t.Fatalf("the upstream saw %d echo calls, want 1 (the one before the revocation)", n)
	}
}
