package mcpgate_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// gateID is the gateway's name in the ledger. The gateway's credential is
// the test server's admin token until tool-server tokens exist; it is
// never the agent's.
const gateID = "mcp-gw"

// world is a real control plane (manual clock), one agent with a grant, a
// Go SDK upstream on Streamable HTTP, and the gateway in front of it
// served over Streamable HTTP.
type world struct {
	srv      *testserver.Server
	clk      *clock.Manual
	admin    *testserver.Clients
	agent    *tetherv1.RegisterRootResponse
	grant    *tetherv1.IssueRootResponse
	events   *mcptest.Events
	gw       *mcpgate.Gateway
	endpoint string // the gateway's MCP URL
	upstream string // the upstream's URL
}

func newWorld(t *testing.T, scopes ...string) *world {
	t.Helper()
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	agent, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "mcp-agent"}))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: agent.Msg.Node.NodeId, Scopes: scopes, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	events := &mcptest.Events{}
	upstream := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(events) }, nil))
	t.Cleanup(upstream.Close)
	w := &world{srv: srv, clk: clk, admin: admin, agent: agent.Msg, grant: grant.Msg, events: events, upstream: upstream.URL}
	w.gw = w.open(t, mcpgate.Upstream{Name: "test", URL: upstream.URL})
	gwHTTP := httptest.NewUnstartedServer(nil)
	gwHTTP.Config.Handler = w.gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + gwHTTP.Listener.Addr().String()})
	gwHTTP.Start()
	t.Cleanup(gwHTTP.Close)
	w.endpoint = gwHTTP.URL + mcpgate.EndpointPath
	return w
}

// open runs a gateway in front of ups with the gateway's own credential.
func (w *world) open(t *testing.T, ups ...mcpgate.Upstream) *mcpgate.Gateway {
	t.Helper()
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, Credential: w.srv.ToolServerToken(t, gateID), GateID: gateID, HTTP: w.srv.HTTP, Upstreams: ups,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return gw
}

// bearer adds the agent's capability token to every request.
type bearer struct {
	token func() string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token())
	return b.next.RoundTrip(r)
}

// connect opens an MCP session on the gateway with the Go SDK's client,
// presenting token as the bearer.
func connectAgent(t *testing.T, endpoint, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts)
	hc := &http.Client{Transport: bearer{token: func() string { return token }, next: http.DefaultTransport}}
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect to the gateway: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, tool string, args any) (string, error) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", err
	}
	if len(res.Content) == 0 {
		return "", nil
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text, nil
	}
	return "", nil
}

// rpcCode is the JSON-RPC error code of err, or 0.
func rpcCode(err error) int64 {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je.Code
	}
	return 0
}

func terminate(t *testing.T, w *world, mode tetherv1.TerminationMode, window, ack time.Duration) *tetherv1.Termination {
	t.Helper()
	resp, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.agent.Node.NodeId, Mode: mode, Reason: "test",
		DrainWindow: durationpb.New(window), CancelAckTimeout: durationpb.New(ack), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Termination
}

func waitState(t *testing.T, w *world, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	var last *tetherv1.Termination
	testserver.WaitFor(t, guardWait, "termination "+id+" to reach "+state.String(), func() bool {
		resp, err := w.admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Msg.Termination
		return last.State == state || state == tetherv1.TerminationState_TERMINATION_STATE_DRAINING && pastDrain(last.State)
	})
	if state == tetherv1.TerminationState_TERMINATION_STATE_DRAINING && (last.State != state || last.Progress.GetCallsInFlight() == 0) {
		// Only a call in flight holds a drain open: with none it ends in
		// the next pass, and a wait for DRAINING would pass only when its
		// poll came first. Said at once, not after a timeout.
		t.Fatalf("termination %s, awaited draining, is %s with %d call(s) in flight: nothing held the drain open (begin a call before the stop)", id, last.State, last.Progress.GetCallsInFlight())
	}
	return last
}

// pastDrain reports whether a termination in state s has left its drain.
func pastDrain(s tetherv1.TerminationState) bool {
	switch s {
	case tetherv1.TerminationState_TERMINATION_STATE_ABORTING, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED:
		return true
	}
	return false
}

// confirmExit: the agent's launcher (an operator, outside the workload)
// attests that the agent's process exited; the agent's own word would be a
// claim the record does not count without a session it saw end.
func confirmExit(t *testing.T, w *world) {
	t.Helper()
	if _, err := w.admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.agent.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
}

func recordOf(t *testing.T, w *world, termID string) *tetherv1.ReconciliationRecord {
	t.Helper()
	resp, err := w.admin.Supervisor.GetRecord(context.Background(), connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: termID}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Record
}

// callsByTool is the record's tool calls keyed by tool, each checked to be
// reported by the gateway.
func callsByTool(t *testing.T, rec *tetherv1.ReconciliationRecord) map[string][]*tetherv1.RecordToolCall {
	t.Helper()
	out := map[string][]*tetherv1.RecordToolCall{}
	for _, c := range rec.ToolCalls {
		if c.GateId != gateID {
			t.Errorf("call %s on %s was reported by gate %q, want the gateway %q", c.CallId, c.Tool, c.GateId, gateID)
		}
		out[c.Tool] = append(out[c.Tool], c)
	}
	return out
}

// guardWait bounds each wait of a test on something the gateway or an
// upstream must do: a wait that never ends fails its test, named, instead
// of hanging the package until go test's own timeout (whose dump, cut to
// its tail, named no test). Not a measure of speed.
const guardWait = 2 * time.Minute

// recv is the next value from ch, or the test fails (what names it) when
// none comes within guardWait.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(guardWait)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %s for %s; nothing came", guardWait, what)
		panic("unreachable")
	}
}

// waitAll waits for wg, or the test fails (what names it) when it has not
// ended within guardWait: a guard against a hang, not a timing.
func waitAll(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done, what)
}
