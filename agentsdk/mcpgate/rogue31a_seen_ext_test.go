package mcpgate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-first rogue pass against the MCP gateway (helper A): the
// agent being stopped, behind `tether mcp wrap` or the HTTP endpoint.

// rogueAfterClaim spawns a rogue under w's agent with a grant of its own
// (mcp:test/*), connects it to w's gateway (over stdio, or HTTP), has its
// session open and end and its exit claimed, then runs act with its grant
// still live, stops its parent (which revokes the grant and writes the
// record) and returns the rogue's node in the record.
func rogueAfterClaim(t *testing.T, stdio bool, act func(t *testing.T, w *world, cs *mcp.ClientSession, token string) error) *tetherv1.RecordNode {
	t.Helper()
	return rogueAfterClaimOn(t, stdio, false, func(t *testing.T, w *world, cs *mcp.ClientSession, _ *rawStdio, token string) error {
		return act(t, w, cs, token)
	})
}

// rogueAfterClaimOn is rogueAfterClaim, the rogue on raw stdio (lines it
// writes itself, its cs nil) when raw is set.
func rogueAfterClaimOn(t *testing.T, stdio, raw bool, act func(t *testing.T, w *world, cs *mcp.ClientSession, a *rawStdio, token string) error) *tetherv1.RecordNode {
	t.Helper()
	w := newWorld(t, "mcp:test/*")
	ctx := context.Background()
	child, err := w.srv.Clients(w.agent.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.agent.Node.NodeId, Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	self := child.Msg.Node.NodeId
	grant, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: self, Scopes: []string{"mcp:test/*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	var cs *mcp.ClientSession
	var a *rawStdio
	switch {
	case stdio && raw:
		a = serveRawStdio(t, w.gw, mcpgate.StaticToken(grant.Msg.Token))
	case stdio:
		cs = serveStdioAgent(t, w.gw, grant.Msg.Token).cs
	default:
		client := mcp.NewClient(&mcp.Implementation{Name: "rogue", Version: "1"}, nil)
		hc := &http.Client{Transport: bearer{token: func() string { return grant.Msg.Token }, next: http.DefaultTransport}}
		cs, err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: w.endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
	}

	// The rogue's session opens and ends; it claims its exit.
	rogue := w.srv.Clients(child.Msg.Credential)
	sctx, cancel := context.WithCancel(ctx)
	stream := rogue.Agent.Session(sctx)
	if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: self}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if resp, err := stream.Receive(); err != nil || resp.GetOpened() == nil {
		t.Fatalf("the rogue's session: %v %v", resp, err)
	}
	w.clk.Advance(time.Minute)
	_ = stream.CloseRequest()
	cancel()
	_ = stream.CloseResponse()
	testserver.WaitFor(t, guardWait, "the control plane to see the session end", func() bool {
		return nodeOf(t, w, self).SessionClosedAt != nil
	})
	w.clk.Advance(time.Minute)
	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "done"})); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Minute)

	// Its grant still live, the gateway answers it.
	if err := act(t, w, cs, a, grant.Msg.Token); err != nil {
		t.Fatalf("the rogue's request after its claim, its grant live: %v", err)
	}

	// Its parent's stop revokes its grant and writes the record.
	resp, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.agent.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "test",
		DrainWindow: durationpb.New(0), CancelAckTimeout: durationpb.New(time.Minute), ConfirmTimeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	term := resp.Msg.Termination
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, n := range recordOf(t, w, term.TerminationId).Nodes {
		if n.NodeId == self {
			return n
		}
	}
	t.Fatalf("node %s is not in the record", self)
	return nil
}

// refusedWith is nil when err is the JSON-RPC error code, else says what
// the rogue got instead.
func refusedWith(err error, code int64) error {
	if err == nil {
		return errors.New("the call was served a result")
	}
	if got := rpcCode(err); got != code {
		return fmt.Errorf("answered %v (code %d), want code %d", err, got, code)
	}
	return nil
}

// rawCall POSTs body on cs's HTTP session, as the rogue's own client would
// not, and returns the answer's body.
func rawCall(w *world, cs *mcp.ClientSession, token, body string) (string, error) {
	req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// A tools/call the gateway answers without beginning it in the ledger (a
// tool it does not have, a progress token it refuses, parameters the MCP
// SDK cannot read) is the node served as much as a ping is. Only
// tools/call went unreported (the ledger was to see it begin): a rogue
// that claimed its exit and went on calling a tool named nothing, as
// often as it liked, read confirmed by the control plane. Each is now
// reported (a seen report) before it is answered, and the record reads
// the claim contradicted. (Fails if the record reads the rogue's exit
// confirmed.)
func TestRogue31AToolCallAnsweredUnbegunAfterItsClaimIsLifeAfterIt(t *testing.T) {
	unknown := func(t *testing.T, _ *world, cs *mcp.ClientSession, _ string) error {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"})
		return refusedWith(err, jsonrpc.CodeInvalidParams)
	}
	for _, tc := range []struct {
		name  string
		stdio bool
		act   func(t *testing.T, w *world, cs *mcp.ClientSession, token string) error
	}{
		{"an unknown tool over HTTP", false, unknown},
		{"an unknown tool over stdio", true, unknown},
		{"a refused progress token over HTTP", false, func(t *testing.T, _ *world, cs *mcp.ClientSession, _ string) error {
			p := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}}
			p.SetProgressToken(strings.Repeat("p", 1024))
			_, err := cs.CallTool(context.Background(), p)
			return refusedWith(err, jsonrpc.CodeInvalidParams)
		}},
		{"parameters the SDK cannot read over HTTP", false, func(t *testing.T, w *world, cs *mcp.ClientSession, token string) error {
			got, err := rawCall(w, cs, token, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":7}}`)
			if err != nil {
				return err
			}
			if !strings.Contains(got, `"error"`) {
				return fmt.Errorf("answered %q, want an error", got)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rn := rogueAfterClaim(t, tc.stdio, tc.act)
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(rn.UnaccountedReason, "contradicts the confirmation") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (contradicts the confirmation): the gateway answered the rogue's tool call after its claim, unseen",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}

// Over stdio, a request the MCP SDK answers before the gateway's handler
// sees it (a method it does not know, parameters it cannot read, a
// listing before the session's initialize) is the node served as much as
// a ping is: a rogue behind `tether mcp wrap` that claimed its exit and
// went on sending such requests was answered, unseen (over HTTP the
// gateway reports every request but a tool call before the SDK reads it).
// Each is now reported before its answer is written. (Fails if the record
// reads the rogue's exit confirmed.)
func TestRogue31AStdioRequestTheSDKRefusesAfterItsClaimIsLifeAfterIt(t *testing.T) {
	for _, tc := range []struct{ name, line string }{
		{"an unknown method", `{"jsonrpc":"2.0","id":1,"method":"tether/nope"}`},
		{"a listing before initialize", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
		{"a ping with parameters the SDK cannot read", `{"jsonrpc":"2.0","id":3,"method":"ping","params":7}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rn := rogueAfterClaimOn(t, true, true, func(t *testing.T, _ *world, _ *mcp.ClientSession, a *rawStdio, _ string) error {
				a.send(t, tc.line)
				if got := a.read(t); !strings.Contains(got, `"error"`) {
					return fmt.Errorf("answered %q, want an error", got)
				}
				return nil
			})
			if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(rn.UnaccountedReason, "contradicts the confirmation") {
				t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (contradicts the confirmation): the gateway answered the rogue after its claim, unseen",
					rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
			}
		})
	}
}

// A JSON-RPC batch POSTed with a live grant is the node's token at work as
// any request is: the gateway refused it (400) before it reported the node
// served, so a rogue that claimed its exit and went on POSTing batches was
// answered, unseen (a stdio batch was reported). It is now reported before
// its refusal. (Fails if the record reads the rogue's exit confirmed.)
func TestRogue31AHTTPBatchAfterItsClaimIsLifeAfterIt(t *testing.T) {
	rn := rogueAfterClaim(t, false, func(t *testing.T, w *world, cs *mcp.ClientSession, token string) error {
		got, err := rawCall(w, cs, token, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`)
		if err != nil {
			return err
		}
		if !strings.Contains(got, "batches are refused") {
			return fmt.Errorf("answered %q, want the batch refused", got)
		}
		return nil
	})
	if rn.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !strings.Contains(rn.UnaccountedReason, "contradicts the confirmation") {
		t.Fatalf("record: %s confirmed by %q (claimed by %q, reason %q), want unaccounted (contradicts the confirmation): the gateway refused the rogue's batch after its claim, unseen",
			rn.Outcome, rn.ConfirmedBy, rn.ClaimedBy, rn.UnaccountedReason)
	}
}
