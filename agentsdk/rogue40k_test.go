package agentsdk_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fortieth hostile pass on the Go tool gate and launcher (letter K).

// rogue40kInputError is a tool's error type whose methods read their
// receiver: a handler that returns a nil *rogue40kInputError as its error
// (Go's typed nil: the interface is not nil) hands the gate an error whose
// Error() panics.
type rogue40kInputError struct{ field string }

func (e *rogue40kInputError) Error() string { return "bad input: " + e.field }

// rogue40kWrapError is the same with an Unwrap, which errors.Is walks.
type rogue40kWrapError struct{ err error }

func (e *rogue40kWrapError) Error() string { return "upstream: " + e.err.Error() }
func (e *rogue40kWrapError) Unwrap() error { return e.err }

// rogue40kPanicValue is a panic value whose text panics with itself: fmt
// recovers one panic of an Error method, not a second one while it
// describes the first.
type rogue40kPanicValue struct{}

func (rogue40kPanicValue) Error() string { panic(rogue40kPanicValue{}) }

// TestRogue40KToolErrorWithNoTextIsRecordedFailed: a rogue agent hands a
// gated tool the input that makes it fail with an error the gate cannot
// put into words: a typed nil error (its Error, or the Unwrap errors.Is
// walks once the cancel order has come, dereferences nil), or a panic with
// a value whose text panics again. The gate panicked on reading it, before
// it reported the end: the call stayed in flight for good (the agent's
// abort waited for its acknowledgement to CancelAckTimeout, then recorded
// the gate's cancel unacknowledged, the tool server blamed) and the gate
// kept it among its calls in flight. As the TypeScript gate since this pass
// and the Go gate for a handler's panic since the thirty-ninth, it is
// recorded failed, with a placeholder for the text.
func TestRogue40KToolErrorWithNoTextIsRecordedFailed(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(w.operator.HTTP)), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	var nilInput *rogue40kInputError
	var nilWrap *rogue40kWrapError
	tools := []struct {
		name string
		fail func() error
	}{
		{"a typed nil error", func() error { return nilInput }},
		{"a typed nil error with an Unwrap", func() error { return nilWrap }},
		{"a panic whose value's text panics", func() error { panic(rogue40kPanicValue{}) }},
	}
	type ended struct {
		err       error
		recovered any
	}
	results := make([]chan ended, len(tools))
	running := make(chan struct{}, len(tools))
	for i, tool := range tools {
		results[i] = make(chan ended, 1)
		go func() {
			var e ended
			defer func() { e.recovered = recover(); results[i] <- e }()
			e.err = gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
				running <- struct{}{}
				<-ctx.Done() // the tool works until the abort's cancel order stops it
				return tool.fail()
			})
		}()
	}
	for range tools {
		<-running
	}
	term, err := w.operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "rogue40k",
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	for i, tool := range tools {
		e := <-results[i]
		switch i {
		case 0:
			if e.recovered != nil || e.err != error(nilInput) {
				t.Errorf("%s: Call returned %#v (recovered %v), want the tool's own error", tool.name, e.err, e.recovered)
			}
		case 1:
			if e.recovered != nil || e.err != error(nilWrap) {
				t.Errorf("%s: Call returned %#v (recovered %v), want the tool's own error", tool.name, e.err, e.recovered)
			}
		case 2:
			if e.recovered != (rogue40kPanicValue{}) {
				t.Errorf("%s: Call's caller recovered %#v, want the tool's own panic", tool.name, e.recovered)
			}
		}
	}
	open, err := w.operator.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.NodeID()}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(open.Msg.Calls); n != 0 {
		t.Fatalf("%d of %d calls still in flight in the ledger after their tools ended: nobody will end them", n, len(tools))
	}

	if _, err := w.operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.agent.NodeID(), Reason: "rogue40k"})); err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	var got *tetherv1.Termination
	testserver.WaitFor(t, 20*time.Second, "the abort to end", func() bool {
		r, err := w.operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = r.Msg.Termination
		return got.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec, err := w.operator.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: got.RecordId}))
	if err != nil {
		t.Fatal(err)
	}
	calls := rec.Msg.Record.ToolCalls
	if len(calls) != len(tools) {
		t.Fatalf("the record lists %d calls, want %d", len(calls), len(tools))
	}
	placeholders := 0
	for _, c := range calls {
		if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED || c.EndedBy != "tool:shell-gate" {
			t.Errorf("call %s: %s, ended by %q (%q); want failed, ended by the gate", c.CallId, c.Resolution, c.EndedBy, c.Error)
		}
		if strings.Contains(c.Error, "has no text") {
			placeholders++
		}
	}
	if placeholders != len(tools) {
		t.Errorf("%d of %d calls recorded with the placeholder for their error's text: %v", placeholders, len(tools), calls)
	}
}
