package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-third hostile pass over termination: what the record says of
// the work in flight when a stop is requested.

// TestACallInFlightAtTheStopRequestIsInTheRecordWhenItEndsBeforeTheMark:
// the seed's record says which tool calls were in flight and how each
// was resolved. A call the rogue's gate began before the operator's stop,
// and ended in the window between the stop's request and its mark (a busy
// reconciler, a restart), was in flight when the stop was requested: the
// record lists it, with its resolution, as it lists one that ends after
// the mark.
func TestACallInFlightAtTheStopRequestIsInTheRecordWhenItEndsBeforeTheMark(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	calls := map[string]string{} // call id -> node
	for _, node := range []string{rogue.Node.NodeId, child.Node.NodeId} {
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		calls[begun.Msg.Call.CallId] = node
	}

	held.hold()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	failed := true
	for id := range calls {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: id, GateId: "gate-1", Failed: failed, Error: "disk full"})); err != nil {
			t.Fatalf("the gate's end of call %s, begun before the stop: %v", id, err)
		}
		failed = false
	}
	if got := getTermination(t, admin, term.TerminationId).State; got != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED {
		t.Fatalf("the operator's termination is %s while the reconciler is held, want requested", got)
	}

	held.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	listed := map[string]*tetherv1.RecordToolCall{}
	for _, c := range rec.ToolCalls {
		listed[c.CallId] = c
	}
	for id, node := range calls {
		c, ok := listed[id]
		if !ok {
			t.Errorf("the record lists %d calls and not call %s of %s, in flight when the stop was requested and ended before its mark", len(rec.ToolCalls), id, node)
			continue
		}
		if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED && c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_FAILED {
			t.Errorf("the record lists call %s of %s as %s, want the gate's report (completed or failed)", id, node, c.Resolution)
		}
		if c.NodeId != node || c.EndedBy != "tool:gate-1" {
			t.Errorf("the record lists call %s as of %s ended by %q, want of %s ended by tool:gate-1", id, c.NodeId, c.EndedBy, node)
		}
	}
}

// TestACallEndedBelowAMarkedRootBeforeItsChunkIsInTheRecord: the mark
// goes top down, a chunk at a time; the operator's drain has marked the
// rogue's root R (its call in flight put on the drain's account) and not
// yet R's child C. C's call, begun before the stop and ended by its gate
// before C's chunk, is listed in the record with the gate's resolution,
// beside R's.
func TestACallEndedBelowAMarkedRootBeforeItsChunkIsInTheRecord(t *testing.T) {
	mark, srv := startMarkHeld(t, 1)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	calls := map[string]string{} // node -> call id
	for _, node := range []string{rogue.Node.NodeId, child.Node.NodeId} {
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if err != nil {
			t.Fatal(err)
		}
		calls[node] = begun.Msg.Call.CallId
	}

	mark.arm()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	select {
	case <-mark.reached:
	case <-time.After(20 * time.Second): // a guard against a hang, not a wait
		t.Fatal("the mark's first chunk (the roots) never committed")
	}
	if got := getNode(t, admin, child.Node.NodeId).State; got != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the child is %s after the roots' chunk, want still running (unmarked)", got)
	}
	for _, node := range []string{child.Node.NodeId, rogue.Node.NodeId} {
		if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: calls[node], GateId: "gate-1"})); err != nil {
			t.Fatalf("the gate's end of the call of %s: %v", node, err)
		}
	}
	mark.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	listed := map[string]*tetherv1.RecordToolCall{}
	for _, c := range rec.ToolCalls {
		listed[c.CallId] = c
	}
	for node, id := range calls {
		c, ok := listed[id]
		if !ok {
			t.Errorf("the record lists %d calls and not call %s of %s, in flight when the stop was requested", len(rec.ToolCalls), id, node)
			continue
		}
		if c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || c.NodeId != node {
			t.Errorf("the record lists call %s as %s of %s, want completed of %s", id, c.Resolution, c.NodeId, node)
		}
	}
	if len(rec.ToolCalls) != len(calls) {
		t.Errorf("the record lists %d calls, want %d (each once)", len(rec.ToolCalls), len(calls))
	}
}
