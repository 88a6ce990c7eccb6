package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func init() {
	Register("mcp/tools-call", onServer(mcpToolsCall))
}

// mcpToolsCall measures what the MCP gateway adds to a tools/call: the
// same Go SDK upstream (Streamable HTTP on loopback) called directly and
// through the gateway (Streamable HTTP on loopback, the agent's capability
// token as the bearer), in the same run. Latency is sequential calls,
// direct and gated alternating so both see the same machine; throughput
// is 16 agents, each with its own session, calling as fast as they can.
// The gated call includes the offline scope check and the ledger's
// BeginCall and EndCall (durable commits on the control plane).
func mcpToolsCall(ctx context.Context, r *Report, srv *benchServer) error {
	_, grant, err := rootWithGrant(ctx, srv, "bench-mcp-agent", time.Hour, "mcp:bench/*")
	if err != nil {
		return err
	}

	upstream := mcptest.NewServer(nil)
	upURL, stopUp, err := mcptest.ServeLoopback(func(string) http.Handler {
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return upstream }, nil)
	})
	if err != nil {
		return err
	}
	defer stopUp()
	minted, err := srv.Admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "bench-mcp-gateway"}))
	if err != nil {
		return err
	}
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: srv.URL, Credential: minted.Msg.Token, GateID: "bench-mcp-gateway",
		Upstreams: []mcpgate.Upstream{{Name: "bench", URL: upURL}},
	})
	if err != nil {
		return err
	}
	defer gw.Close()
	gwBase, stopGateway, err := mcptest.ServeLoopback(func(base string) http.Handler { return gw.Handler(mcpgate.HTTPOptions{BaseURL: base}) })
	if err != nil {
		return err
	}
	defer stopGateway()
	gwURL := gwBase + mcpgate.EndpointPath

	open := func(endpoint, token string) (*mcp.ClientSession, error) {
		hc := &http.Client{Transport: mcptest.Bearer{Token: token, Next: &http.Transport{MaxIdleConnsPerHost: 64}}}
		return mcp.NewClient(&mcp.Implementation{Name: "bench-agent", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	}
	call := func(ctx context.Context, cs *mcp.ClientSession) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}})
		if err == nil && res.IsError {
			err = errors.New("echo returned an error result")
		}
		return err
	}

	direct, err := open(upURL, "")
	if err != nil {
		return err
	}
	defer direct.Close()
	gated, err := open(gwURL, grant.Token)
	if err != nil {
		return err
	}
	defer gated.Close()

	// Latency: alternate, after a warm-up.
	var directLat, gatedLat []time.Duration
	deadline := time.Now().Add(r.Duration)
	for i := 0; time.Now().Before(deadline) || i < 200; i++ {
		for _, s := range []struct {
			cs  *mcp.ClientSession
			out *[]time.Duration
		}{{direct, &directLat}, {gated, &gatedLat}} {
			start := time.Now()
			if err := call(ctx, s.cs); err != nil {
				return err
			}
			if i >= 50 {
				*s.out = append(*s.out, time.Since(start))
			}
		}
	}
	dp50, dp99 := percentile(directLat, 0.50), percentile(directLat, 0.99)
	gp50, gp99 := percentile(gatedLat, 0.50), percentile(gatedLat, 0.99)
	r.Add("mcp/tools-call/direct-p50", ms(dp50), "ms")
	r.Add("mcp/tools-call/direct-p99", ms(dp99), "ms")
	r.Add("mcp/tools-call/gateway-p50", ms(gp50), "ms")
	r.Add("mcp/tools-call/gateway-p99", ms(gp99), "ms")
	r.Add("mcp/tools-call/added-p50", ms(gp50-dp50), "ms")
	r.Add("mcp/tools-call/added-p99", ms(gp99-dp99), "ms")

	// Throughput: 16 agents, each its own node with its own grant and one
	// session (the gateway bounds the sessions of one node).
	const agents = 16
	tokens := make([]string, agents)
	for i := range tokens {
		_, g, err := rootWithGrant(ctx, srv, fmt.Sprintf("bench-mcp-agent-%d", i), time.Hour, "mcp:bench/*")
		if err != nil {
			return err
		}
		tokens[i] = g.Token
	}
	for _, s := range []struct {
		name, endpoint string
		tokens         []string
	}{{"direct", upURL, make([]string, agents)}, {"gateway", gwURL, tokens}} {
		sessions := make([]*mcp.ClientSession, agents)
		for i := range sessions {
			if sessions[i], err = open(s.endpoint, s.tokens[i]); err != nil {
				return err
			}
		}
		rate, err := Throughput(ctx, agents, r.Duration, func(ctx context.Context, w int) error { return call(ctx, sessions[w]) })
		for _, cs := range sessions {
			cs.Close()
		}
		if err != nil {
			return fmt.Errorf("%s throughput: %w", s.name, err)
		}
		r.Add("mcp/tools-call/"+s.name+"-throughput-16-agents", rate, "calls/s")
	}
	return nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
