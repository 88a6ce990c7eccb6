package mcpgate_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/mcptest"
)

// docs/mcp.md's first step minted the gateway an operator token. The
// gateway started on it, listed its tools and served — and the control
// plane refused every call it tried to record ("only a tool server may
// report tool calls"), so every agent's call failed, long after the
// operator had walked away. The gateway now refuses to start on anything
// but a tool server's token, and says which token to mint.
func TestRogue25TourGatewayRefusesToStartOnAnOperatorToken(t *testing.T) {
	srv := testserver.Start(t)
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(&mcptest.Events{}) }, nil))
	t.Cleanup(up.Close)
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: srv.URL, Credential: srv.Admin, GateID: "mcp-gateway", HTTP: srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: up.URL}},
	})
	if err == nil {
		gw.Close()
		t.Fatal("the gateway started on an operator token; every call it records would be refused")
	}
	for _, want := range []string{"operator:admin", "tool server", "tether token create --tool-server"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), srv.Admin[len(srv.Admin)-16:]) {
		t.Errorf("the refusal %q echoes the token", err)
	}
}
