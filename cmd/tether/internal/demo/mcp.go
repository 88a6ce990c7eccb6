package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/embedded"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// RunMCP plays the MCP story: an agent reaches an MCP server through the
// Tether MCP gateway with its capability token; its subtree is drained
// with two calls in flight. A new call is refused, one call finishes in
// the window, the other outlasts it and is cancelled upstream when the
// drain escalates to abort; the record lists all three, as the gateway
// reported them. Like Run, it waits for facts, not for time (apart from
// the drain window itself).
func RunMCP(ctx context.Context, opts Options, out io.Writer) (*Result, error) {
	dir, err := opts.prepare("tether-demo-mcp-")
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv, err := embedded.Start(ctx, filepath.Join(dir, "data"))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	admin := agentsdk.Dial(srv.URL, srv.AdminToken)
	say("▶ control plane on %s (Badger in %s)", srv.URL, filepath.Join(dir, "data"))

	// An MCP server written with the Go SDK, and the gateway in front of
	// it with its own credential (not the agent's).
	events := &mcptest.Events{}
	upstreamURL, stopUpstream, err := mcptest.ServeLoopback(func(string) http.Handler {
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(events) }, nil)
	})
	if err != nil {
		return nil, err
	}
	defer stopUpstream()
	gateToken, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "mcp-gateway", Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		return nil, err
	}
	gw, err := mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: srv.URL, Credential: gateToken.Msg.Token, GateID: "mcp-gateway",
		Upstreams: []mcpgate.Upstream{{Name: "research", URL: upstreamURL}},
	})
	if err != nil {
		return nil, err
	}
	defer gw.Close()
	gwBase, stopGateway, err := mcptest.ServeLoopback(func(base string) http.Handler { return gw.Handler(mcpgate.HTTPOptions{BaseURL: base}) })
	if err != nil {
		return nil, err
	}
	defer stopGateway()
	say("▶ MCP server \"research\" (tools echo, slow, fail) behind the gateway at %s%s", gwBase, mcpgate.EndpointPath)

	// The agent and its grant.
	reg, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "analyst"}))
	if err != nil {
		return nil, err
	}
	node := reg.Msg.Node.NodeId
	grant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: node, Scopes: []string{"mcp:research/echo", "mcp:research/slow"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: mcptest.Bearer{Token: grant.Msg.Token}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "analyst", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: gwBase + mcpgate.EndpointPath, HTTPClient: hc}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, t := range list.Tools {
		names = append(names, t.Name)
	}
	say("▶ analyst (%s) holds mcp:research/echo and mcp:research/slow; tools/list shows: %s", node, strings.Join(names, ", "))
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fail", Arguments: map[string]any{}}); err != nil {
		say("  tools/call fail → %v", err)
	}

	// Two slow calls in flight.
	slow := func(id string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": id}})
			done <- err
		}()
		return done
	}
	summarise, crawl := slow("summarise"), slow("crawl")
	<-events.Started("summarise")
	<-events.Started("crawl")
	say("▶ two MCP calls in flight: slow(summarise) and slow(crawl)")

	term, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "demo",
		DrainWindow: durationpb.New(opts.DrainWindow), CancelAckTimeout: durationpb.New(10 * time.Second), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		return nil, err
	}
	termID := term.Msg.Termination.TerminationId
	say("\n$ tether terminate %s --mode drain --window %s", node, opts.DrainWindow)
	if err := waitTermination(ctx, admin, termID, tetherv1.TerminationState_TERMINATION_STATE_DRAINING); err != nil {
		return nil, err
	}
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "one more thing"}})
	say("  draining     a new tools/call echo → %v", err)
	events.Release("summarise")
	if err := <-summarise; err != nil {
		return nil, fmt.Errorf("the call that should finish in the window: %w", err)
	}
	say("               slow(summarise) finishes within the window")
	<-events.Cancelled("crawl")
	err = <-crawl
	say("  aborting     the window is over: slow(crawl) is cancelled upstream (the server saw notifications/cancelled); the agent gets: %v", err)
	if err := waitTermination(ctx, admin, termID, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING); err != nil {
		return nil, err
	}
	if _, err := agentsdk.Dial(srv.URL, reg.Msg.Credential).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: node})); err != nil {
		return nil, err
	}
	if err := waitTermination(ctx, admin, termID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED); err != nil {
		return nil, err
	}
	rec, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: termID}))
	if err != nil {
		return nil, err
	}
	say("")
	PrintRecord(out, rec.Msg.Record, map[string]string{node: "analyst"})
	for _, c := range rec.Msg.Record.ToolCalls {
		say("    %-16s %-22s reported by gate %s", c.Tool, strings.ToLower(strings.TrimPrefix(c.Resolution.String(), "CALL_RESOLUTION_")), c.GateId)
	}
	b, err := wire.RecordJSON(rec.Msg.Record)
	if err != nil {
		return nil, err
	}
	res := &Result{Record: rec.Msg.Record, RecordPath: filepath.Join(dir, "record-"+rec.Msg.Record.RecordId+".json")}
	if err := os.WriteFile(res.RecordPath, b, 0o644); err != nil {
		return nil, err
	}
	say("▶ full record (JSON, schema docs/record.schema.json): %s", res.RecordPath)
	return res, nil
}

// waitTermination follows the termination until it reaches state.
func waitTermination(ctx context.Context, admin *agentsdk.Conn, id string, state tetherv1.TerminationState) error {
	stream, err := admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: id}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if stream.Msg().Termination.State == state {
			return nil
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	return errors.New("the termination watch ended before " + state.String())
}
