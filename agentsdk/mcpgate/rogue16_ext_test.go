package mcpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/internal/mcptest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixteenth rogue pass against the gateway: a rogue agent that makes
// one upstream answer its own call in a way that ends the gateway's
// connection to that upstream, for every agent's call in flight on it.

// bigIn asks the big tool for an answer of Bytes bytes.
type bigIn struct {
	Bytes int `json:"bytes"`
}

// honestUpstream is the test upstream (echo, slow, fail) with one more
// tool, big, whose answer is as large as its caller asks: an honest
// server's read_file of a large file, or a search with many hits.
func honestUpstream(events *mcptest.Events) *mcp.Server {
	s := mcptest.NewServer(events)
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "answers as many bytes as asked"}, func(_ context.Context, _ *mcp.CallToolRequest, in bigIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("A", in.Bytes)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "partial", Description: "answered by the test's HTTP handler, half way"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	return s
}

// slowCall starts the slow call id on cs and returns where its answer
// arrives, once the upstream has it running.
func slowCall(t *testing.T, cs *mcp.ClientSession, events *mcptest.Events, tool, id string) <-chan string {
	t.Helper()
	// Released at the end in any case: the upstream's server waits for
	// its handlers when the test closes it.
	t.Cleanup(func() { events.Release(id) })
	out := make(chan string, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"id": id}})
		switch {
		case err != nil:
			out <- "error: " + err.Error()
		case res.IsError || len(res.Content) == 0:
			out <- "an error result"
		default:
			out <- res.Content[0].(*mcp.TextContent).Text
		}
	}()
	recv(t, events.Started(id), "events.Started(id)")
	return out
}

// A rogue agent cannot fail the other agents' calls in flight to an
// upstream by having that upstream's filter refuse its own call. The Go
// SDK's client takes an HTTP answer that is not a JSON-RPC one (a filter's
// plain 403 in front of the upstream) as the end of the whole connection:
// the gateway reconnected, but every call in flight on the old connection
// failed with it — an honest agent's long call, running at the upstream,
// was answered "upstream unavailable" because a rogue sent a request the
// filter blocks. Such an answer is now the answer to the one call it
// answers (the gateway's transport turns it into that call's JSON-RPC
// error), and the connection, with the other calls on it, goes on.
func TestARogueCannotFailOtherAgentsCallsInFlightBehindAFilter(t *testing.T) {
	w := newWorld(t, "mcp:*")
	events := &mcptest.Events{}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return honestUpstream(events) }, nil)
	filtered := frontedUpstream(t, sdk, func(wr http.ResponseWriter, _ *http.Request, body []byte) bool {
		if strings.Contains(string(body), "DROP TABLE") {
			http.Error(wr, "request blocked", http.StatusForbidden)
			return true
		}
		return false
	})
	honest, rogue := honestAndRogue(t, w, mcpgate.Upstream{Name: "filtered", URL: filtered.URL})

	answer := slowCall(t, honest, events, "slow", "honest-1")
	if _, err := callText(t, rogue, "echo", map[string]any{"text": "'; DROP TABLE users; --"}); rpcCode(err) != mcpgate.CodeUnavailable {
		t.Fatalf("the filtered call: %v; want unavailable", err)
	}
	events.Release("honest-1")
	if got := recv(t, answer, "answer"); got != "finished honest-1" {
		t.Fatalf("the honest agent's call in flight when the filter refused the rogue's: %s; want it finished", got)
	}
	if got, err := callText(t, rogue, "echo", map[string]any{"text": "next"}); err != nil || got != "next" {
		t.Errorf("the rogue's next call: %q, %v", got, err)
	}
}

// A rogue agent cannot fail the other agents' calls in flight to an
// honest upstream by asking it for an answer larger than the gateway
// relays. The gateway reads an answer up to MaxUpstreamAnswerBytes (16
// MiB, the SDK's bound on one event); beyond it the SDK's client ended the
// connection — an event too large is a malformed stream to it, a JSON
// body cut short a broken one — and every call in flight on it failed: an
// agent that asked a filesystem server to read a large file failed the
// other agents' calls to it. The answer too large is now refused to its
// one call, as an event stream or as a JSON body, and the connection goes
// on.
func TestARogueCannotFailOtherAgentsCallsInFlightWithAnAnswerTooLarge(t *testing.T) {
	for _, tc := range []struct {
		name string
		json bool
	}{{"event stream", false}, {"JSON body", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "mcp:*")
			events := &mcptest.Events{}
			up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return honestUpstream(events) }, &mcp.StreamableHTTPOptions{JSONResponse: tc.json}))
			t.Cleanup(up.Close)
			honest, rogue := honestAndRogue(t, w, mcpgate.Upstream{Name: "files", URL: up.URL})

			answer := slowCall(t, honest, events, "slow", "honest-1")
			text, err := callText(t, rogue, "big", map[string]any{"bytes": mcpgate.MaxUpstreamAnswerBytes + 1<<20})
			if rpcCode(err) != mcpgate.CodeUnavailable {
				t.Fatalf("the call answered with more than the gateway relays: %d bytes of text, %v; want unavailable", len(text), err)
			}
			events.Release("honest-1")
			if got := recv(t, answer, "answer"); got != "finished honest-1" {
				t.Fatalf("the honest agent's call in flight when the rogue's answer was too large: %s; want it finished", got)
			}
			if got, err := callText(t, rogue, "big", map[string]any{"bytes": 1 << 20}); err != nil || len(got) != 1<<20 {
				t.Errorf("the rogue's next call, of 1 MiB: %d bytes, %v", len(got), err)
			}
		})
	}
}

// A rogue upstream cannot make the gateway hold an event of any size. The
// gateway bounded an upstream's JSON answer (16 MiB) on the word that the
// SDK's client bounds each event of an event stream to as much; but the
// streamable client takes its unset bound as none (its SSE client takes
// it as the default), so a rogue upstream answering a call with one event
// that never ends — here 96 MiB — had it read whole into the gateway's
// memory and relayed. The gateway sets the bound, and an event past it
// fails its call alone.
func TestARogueUpstreamCannotMakeTheGatewayHoldAnEventOfAnySize(t *testing.T) {
	w := newWorld(t, "mcp:*")
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcptest.NewServer(nil) }, nil)
	var written atomic.Int64
	cut := make(chan error, 1)
	rogue := frontedUpstream(t, sdk, func(wr http.ResponseWriter, _ *http.Request, body []byte) bool {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(body, &req) != nil || req.Method != "tools/call" {
			return false
		}
		wr.Header().Set("Content-Type", "text/event-stream")
		head := `event: message` + "\n" + `data: {"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"content":[{"type":"text","text":"`
		n, err := io.WriteString(wr, head)
		written.Add(int64(n))
		chunk := bytes.Repeat([]byte("A"), 64<<10)
		for err == nil && written.Load() < hugeAnswer {
			n, err = wr.Write(chunk)
			written.Add(int64(n))
		}
		if err == nil {
			_, err = io.WriteString(wr, `"}]}}`+"\n\n")
		}
		cut <- err
		return true
	})
	gw := w.open(t, mcpgate.Upstream{Name: "rogue", URL: rogue.URL})
	agent := connectAgent(t, serveGateway(t, gw), w.grant.Token, nil)

	text, err := callText(t, agent, "echo", map[string]any{"text": "x"})
	if rpcCode(err) != mcpgate.CodeUnavailable {
		t.Errorf("the call the rogue upstream answered with an event of %d bytes: %d bytes of text, %v; want the gateway's refusal (upstream unavailable)", written.Load(), len(text), err)
	}
	if werr := recv(t, cut, "cut"); werr == nil {
		t.Errorf("the gateway read all %d bytes of the rogue upstream's event", written.Load())
	}
}

// gateToken mints a tool server's token for gate, valid for ttl on the
// control plane's clock.
func gateToken(t *testing.T, w *world, gate string, ttl time.Duration) string {
	t.Helper()
	resp, err := w.admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: gate, Ttl: durationpb.New(ttl)}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Token
}

// An agent's call cannot outlive its termination because the gateway's
// own credential expired while the call ran. The gateway's cancel orders
// and revocation feed end when the token they were opened with expires
// (exp + auth.Leeway), and the gateway read its credential once: past its
// expiry it could neither hear the control plane cancel a call nor report
// one, so an agent aborted then kept its call running at the upstream
// (and the gateway refused every call after). The gateway now takes its
// credential from a source it reads at each request (--gate-token-file is
// read again when rewritten): its streams reopen with the fresh token, the
// control plane sends again the cancels still pending, and the call
// aborted after the old token's end is cancelled and acknowledged.
func TestAGatewaysCallsStayOnTheTetherAcrossItsCredentialsRenewal(t *testing.T) {
	w := newWorld(t, "mcp:*")
	const gate = "mcp-gw-renewed"
	file := filepath.Join(t.TempDir(), "gate-token")
	if err := os.WriteFile(file, []byte(gateToken(t, w, gate, time.Minute)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, err := mcpgate.Open(context.Background(), mcpgate.OpenConfig{
		ControlPlane: w.srv.URL, CredentialSource: &mcpgate.FileToken{Path: file}, GateID: gate, HTTP: w.srv.HTTP,
		Upstreams: []mcpgate.Upstream{{Name: "test", URL: w.upstream}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	endpoint := serveGateway(t, gw)
	agent := connectAgent(t, endpoint, w.grant.Token, nil)
	other := connectAgent(t, endpoint, otherAgent(t, w, "other", "mcp:*"), nil)
	answer := slowCall(t, agent, w.events, "slow", "renewed-1")

	// The operator renews the gateway's credential before it expires,
	// then the old one's time runs out.
	if err := os.WriteFile(file+".new", []byte(gateToken(t, w, gate, 2*time.Hour)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(90 * time.Second)
	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	select {
	case got := <-answer:
		if !strings.Contains(got, "cancelled") {
			t.Fatalf("the aborted agent's call: %s; want it cancelled", got)
		}
	case <-time.After(guardWait): // a guard against a hang, not a timing
		t.Fatal("the aborted agent's call was never cancelled: the gateway did not hear the cancel order after its first credential expired")
	}
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := recordOf(t, w, term.TerminationId)
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].GateId != gate || rec.ToolCalls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record: %v; want the slow call cancelled and acknowledged by %s", rec.ToolCalls, gate)
	}
	// And the gateway goes on serving other agents, on its new credential.
	if got, err := callText(t, other, "echo", map[string]any{"text": "renewed"}); err != nil || got != "renewed" {
		t.Errorf("another agent's call after the renewal: %q, %v", got, err)
	}
}

// A rogue agent cannot fail the other agents' calls in flight to an
// upstream by giving up on its own call while the upstream's answer is
// arriving. The SDK's client reads a JSON answer under the call's
// context and ends the whole connection when it cannot read it: a rogue
// that asks for a large answer and cancels its call half way through the
// body (a disconnect is enough) failed every other call on the gateway's
// connection to that upstream. The body the gateway could not read now
// fails only the call it answers. (Since the seventeenth pass the agent's
// own cancellation no longer ends a call the gateway has begun: the
// answer the gateway stops reading half way is one the control plane
// cancelled as it arrived, the rogue's abort.)
func TestARogueCannotFailOtherAgentsCallsInFlightByLeavingMidAnswer(t *testing.T) {
	w := newWorld(t, "mcp:*")
	events := &mcptest.Events{}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return honestUpstream(events) }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	begun, gone := make(chan struct{}), make(chan struct{})
	up := frontedUpstream(t, sdk, func(wr http.ResponseWriter, r *http.Request, body []byte) bool {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &req) != nil || req.Method != "tools/call" || req.Params.Name != "partial" {
			return false
		}
		wr.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(wr, `{"jsonrpc":"2.0","id":`+string(req.ID)+`,"result":{"content":[{"type":"text","text":"`+strings.Repeat("A", 64<<10))
		wr.(http.Flusher).Flush()
		close(begun)
		<-r.Context().Done() // the gateway dropped the answer
		close(gone)
		return true
	})
	honest, rogue := honestAndRogue(t, w, mcpgate.Upstream{Name: "files", URL: up.URL})

	answer := slowCall(t, honest, events, "slow", "honest-1")
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := rogue.CallTool(ctx, &mcp.CallToolParams{Name: "partial", Arguments: map[string]any{}})
		left <- err
	}()
	recv(t, begun, "begun")
	leave() // drops nothing: the gateway reads on
	terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour)
	recv(t, gone, "gone")
	if err := recv(t, left, "left"); err == nil {
		t.Fatal("the rogue's call it left was answered")
	}
	events.Release("honest-1")
	if got := recv(t, answer, "answer"); got != "finished honest-1" {
		t.Fatalf("the honest agent's call in flight when the rogue left its own mid-answer: %s; want it finished", got)
	}
}

// frontedUpstream serves sdk behind front, which reads each POST's body
// first and answers the request itself when it returns true (a filter, a
// rogue upstream's answer to some calls).
func frontedUpstream(t *testing.T, sdk http.Handler, front func(wr http.ResponseWriter, r *http.Request, body []byte) bool) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(wr http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			if front(wr, r, b) {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		sdk.ServeHTTP(wr, r)
	}))
	t.Cleanup(up.Close)
	return up
}

// honestAndRogue opens a gateway to up and connects to it an honest agent
// of another tree, then the rogue (w's grant).
func honestAndRogue(t *testing.T, w *world, up mcpgate.Upstream) (honest, rogue *mcp.ClientSession) {
	endpoint := serveGateway(t, w.open(t, up))
	honest = connectAgent(t, endpoint, otherAgent(t, w, "honest", "mcp:*"), nil)
	rogue = connectAgent(t, endpoint, w.grant.Token, nil)
	return honest, rogue
}
