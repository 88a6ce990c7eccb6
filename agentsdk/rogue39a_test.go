package agentsdk_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-ninth hostile pass on the Go agent SDK (letter A).

// TestRogue39ARunWaitsForTheAbortCallbacksTheSessionStarted: Run promises
// to return its refusal of a dead credential once the OnAbort callbacks
// have returned, so that an agent whose main returns (exits) when Run does
// has cleaned up first (its subprocesses stopped, its leases given back).
// A rogue parent (here an operator, as one) aborts the agent: the abort
// reaches it over its session first, which starts its OnAbort callbacks;
// the refusal that ends its session comes after. Run noted that second
// abort, found the callbacks already started (by the first) and returned
// at once, while they still ran: the agent's process ended in the middle
// of its cleanup.
func TestRogue39ARunWaitsForTheAbortCallbacksTheSessionStarted(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	a, err := agentsdk.RegisterRoot(ctx, operator, "rogue39a-abort-cleanup", nil)
	if err != nil {
		t.Fatal(err)
	}
	a.HeartbeatEvery = 250 * time.Millisecond // the refusal comes at its next heartbeat
	cleaning := make(chan agentsdk.Signal, 1)
	release := make(chan struct{})
	cleaned := make(chan struct{})
	a.OnAbort(func(s agentsdk.Signal) {
		cleaning <- s
		<-release // the cleanup, under way until the test lets it end
		close(cleaned)
	})
	waiting := make(chan struct{})
	t.Cleanup(agentsdk.WhenRunWaitsForAbortCallbacks(a, func() { close(waiting) }))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(runCtx) }()
	<-a.Opened()

	rogue36aTerminate(t, operator, a.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_ABORT)
	select {
	case s := <-cleaning:
		if !s.Abort {
			t.Fatalf("OnAbort was told %+v, want the abort", s)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatal("OnAbort was not called on the abort signal")
	}
	// The launcher's attestation ends the stop: the node is terminated
	// and its credential refused, which ends the session.
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: a.NodeID(), Reason: "rogue39a: the process ended"})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		close(release)
		t.Fatalf("Run returned (%v) while the OnAbort callback the abort signal started was still cleaning up", err)
	case <-waiting:
	case <-time.After(30 * time.Second): // a guard against the hang, not a timing
		close(release)
		t.Fatal("Run never heard its session refused")
	}
	close(release)
	err = <-ran
	select {
	case <-cleaned:
	default:
		t.Fatalf("Run returned (%v) before its OnAbort callback had", err)
	}
	if c := connect.CodeOf(err); c != connect.CodeUnauthenticated && c != connect.CodePermissionDenied && c != connect.CodeFailedPrecondition {
		t.Fatalf("Run returned %v, want the refusal that ended its session", err)
	}
	if !errors.Is(context.Cause(a.Context()), agentsdk.ErrAborted) {
		t.Fatalf("the agent's context ended with %v, want ErrAborted", context.Cause(a.Context()))
	}
}

// TestRogue39AToolThatPanicsIsRecordedFailed: a rogue agent hands a gated
// HTTP tool the input that crashes it (a nil map, an index out of range):
// net/http recovers the handler's panic and serves on, but the gate never
// heard how the call ended. The call stayed in flight in the ledger (and
// in the gate's memory, one entry a crash), so the agent's drain waited
// for it to its deadline and the abort then recorded the gate's cancel
// unacknowledged: the tool server blamed for a call its tool no longer
// ran. The gate records it failed and lets the panic go on.
func TestRogue39AToolThatPanicsIsRecordedFailed(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(w.operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()
	openCalls := func() []*tetherv1.ToolCall {
		t.Helper()
		open, err := w.operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.NodeID()}))
		if err != nil {
			t.Fatal(err)
		}
		return open.Msg.Calls
	}

	// Through Middleware, as a tool server serves it.
	tool := httptest.NewUnstartedServer(gate.Middleware("shell", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		var crash map[string]int
		crash["rogue input"] = 1 // a tool that trusts its input
	})))
	tool.Config.ErrorLog = log.New(io.Discard, "", 0) // net/http reports the recovered panic
	tool.Start()
	t.Cleanup(tool.Close)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tool.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(agentsdk.CapabilityHeader, w.rootToken)
	if resp, err := tool.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the crashed tool answered %s, want the connection dropped", resp.Status)
	}
	if calls := openCalls(); len(calls) != 0 {
		t.Fatalf("the ledger still holds call %s as %s after its tool crashed: nobody will end it", calls[0].CallId, calls[0].State)
	}

	// Through Call: the panic goes on to the gate's caller, once recorded.
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_ = gate.Call(ctx, w.rootToken, "shell", func(context.Context) error { panic("rogue input " + w.rootToken) })
	}()
	if recovered != "rogue input "+w.rootToken {
		t.Fatalf("Call's caller recovered %v, want the tool's own panic", recovered)
	}
	if calls := openCalls(); len(calls) != 0 {
		t.Fatalf("the ledger still holds call %s as %s after its tool panicked: nobody will end it", calls[0].CallId, calls[0].State)
	}
}

// heldRefresh holds the Refresh requests it carries, once hold is closed,
// until release is: a control plane slow to answer (a rogue sibling spent
// the lineage's budget, and the refresh waits the refusals' hints).
type heldRefresh struct {
	base          http.RoundTripper
	hold, release chan struct{}
	entered       chan struct{} // one per held request
}

func (h *heldRefresh) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/Refresh") {
		select {
		case <-h.hold:
			h.entered <- struct{}{}
			<-h.release
		default:
		}
	}
	return h.base.RoundTrip(r)
}

// TestRogue39ACapabilityTokenCallerLeavesOnItsOwnContext: concurrent
// callers of a CapabilityToken share one refresh, and the shared refresh
// held the token's lock through its call: while it waited (a rogue
// sibling spent the lineage's rate budget, and the refresh waited out the
// refusals' hints, up to the call's 30 s), every other caller waited on
// the lock past its own context's end — a tool call with a one-second
// deadline held for half a minute. A caller now waits for the shared
// refresh, or until its own context ends.
func TestRogue39ACapabilityTokenCallerLeavesOnItsOwnContext(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := context.Background()
	held := &heldRefresh{base: srv.HTTP.Transport, hold: make(chan struct{}), release: make(chan struct{}), entered: make(chan struct{}, 4)}
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(&http.Client{Transport: held}))
	me, err := agentsdk.RegisterRoot(ctx, admin, "rogue39a-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: me.NodeID(), Scopes: []string{"tool:echo"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	source, err := me.CapabilityTokenFor(ctx, root.Msg.Grant.GrantId, agentsdk.WithTokenClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(source.Grant().ExpiresAt.Sub(clk.Now()) * 3 / 4) // due for a refresh

	close(held.hold)
	shared := make(chan error, 1)
	go func() { _, err := source.Token(ctx); shared <- err }()
	<-held.entered // the shared refresh waits for the control plane

	gone, cancel := context.WithCancel(ctx)
	cancel() // this caller's deadline has passed
	left := make(chan error, 1)
	go func() { _, err := source.Token(gone); left <- err }()
	select {
	case err := <-left:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the caller whose context ended got %v, want its context's error", err)
		}
	case <-time.After(10 * time.Second): // a guard against the hang, not a timing
		close(held.release)
		t.Fatal("a caller whose context had ended waited for another caller's refresh")
	}
	close(held.release)
	if err := <-shared; err != nil {
		t.Fatalf("the shared refresh: %v", err)
	}
	// The refresh is shared: a caller after it has the fresh token, with no
	// refresh of its own.
	if tok, err := source.Token(gone); err != nil || tok != source.Grant().Token {
		t.Fatalf("after the refresh: %v, want the fresh token", err)
	}
}
