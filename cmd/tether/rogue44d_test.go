package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue44dWorld is a real control plane on a manual clock with an
// operator's root "planner", its child "worker" (the rogue) and the
// rogue's child "helper", each with its credential.
type rogue44dWorld struct {
	srv   *testserver.Server
	clk   *clock.Manual
	admin *testserver.Clients
	nodes map[string]*tetherv1.Node
	creds map[string]string
}

func newRogue44DWorld(t *testing.T) *rogue44dWorld {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk))
	w := &rogue44dWorld{srv: srv, clk: clk, admin: srv.AdminClients(), nodes: map[string]*tetherv1.Node{}, creds: map[string]string{}}
	ctx := context.Background()
	root, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["planner"], w.creds["planner"] = root.Msg.Node, root.Msg.Credential
	for _, s := range []struct{ parent, name string }{{"planner", "worker"}, {"worker", "helper"}} {
		resp, err := srv.Clients(w.creds[s.parent]).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.nodes[s.parent].NodeId, Name: s.name}))
		if err != nil {
			t.Fatalf("spawn %s: %v", s.name, err)
		}
		w.nodes[s.name], w.creds[s.name] = resp.Msg.Node, resp.Msg.Credential
	}
	return w
}

// waitTermination waits for termination id to reach state, and returns it.
func (w *rogue44dWorld) waitTermination(t *testing.T, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	var last *tetherv1.Termination
	testserver.WaitFor(t, 30*time.Second, "termination "+id+" to reach "+state.String(), func() bool {
		resp, err := w.admin.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Msg.Termination
		return last.State == state && (state != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED || last.RecordId != "")
	})
	return last
}

// recordRow is the row of `tether record ls` that lists record id.
func recordRow(t *testing.T, out, id string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, id) {
			return l
		}
	}
	t.Fatalf("tether record ls does not list %s:\n%s", id, out)
	return ""
}

// TestRogue44DRecordShowTellsANodeLeftToAnotherStop: the rogue worker
// drains its own child on a day's window; the operator then aborts the
// worker, which takes the child over, and the rogue's stop finishes at
// once with a record that lists the child superseded by the operator's
// abort. `tether record show` counted every node not confirmed as
// unaccounted: it printed the child UNACCOUNTED in the rogue's record
// (and `record ls` counted it there), with no word of the termination
// that does account for it, while the console (rogue43k) counts it apart
// and links that termination. The CLI now says the same: left to the
// operator's termination, named, and not unaccounted.
func TestRogue44DRecordShowTellsANodeLeftToAnotherStop(t *testing.T) {
	w := newRogue44DWorld(t)
	ctx := context.Background()
	rogue := w.srv.Clients(w.creds["worker"])
	inner, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["helper"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(24 * time.Hour), CancelAckTimeout: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(24 * time.Hour),
		Reason: "routine cleanup",
	}))
	if err != nil {
		t.Fatalf("the rogue's drain of its child: %v", err)
	}
	innerID := inner.Msg.Termination.TerminationId
	w.waitTermination(t, innerID, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	outer, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["worker"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatalf("the operator's abort: %v", err)
	}
	outerID := outer.Msg.Termination.TerminationId
	done := w.waitTermination(t, innerID, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	out := mustCLI(t, w.srv.URL, w.srv.Admin, "record", "show", done.RecordId)
	helper := w.nodes["helper"].NodeId
	if strings.Contains(out, "UNACCOUNTED  helper") || !strings.Contains(out, "Nodes: 0 confirmed, 0 unaccounted, 1 left to other terminations") {
		t.Errorf("tether record show counts the child, left to the operator's %s, unaccounted (or confirmed):\n%s", outerID, out)
	}
	if !strings.Contains(out, "left to      helper           "+helper+" by termination "+outerID+" (tether record show "+outerID+")") {
		t.Errorf("tether record show does not name the termination %s that accounts for the child:\n%s", outerID, out)
	}
	row := recordRow(t, mustCLI(t, w.srv.URL, w.srv.Admin, "record", "ls", "--tree", helper), done.RecordId)
	if cells := strings.Fields(row); len(cells) != 9 || cells[5] != "0" || cells[6] != "1" {
		t.Errorf("tether record ls's row of the rogue's record: %q, want 0 unaccounted and 1 left to others", row)
	}
}

// TestRogue44DRecordShowSaysACallRanOnAfterItsCancel: the operator aborts
// the rogue with its http call in flight; the abort orders the call's
// cancel, and the rogue's tool server, instead of acknowledging it, lets
// the tool run on and reports the call completed afterwards. The record
// resolves the call completed, with the time its cancel was ordered, and
// `tether record show` printed it "completed" like any call that ended
// before the stop (its totals "1 completed"): an abort whose tool went on
// acting read as one that stopped it, where the console (rogue43k) lists
// it under Needs attention. The CLI now says it ran on after its cancel,
// when the cancel was ordered and when the call ended.
func TestRogue44DRecordShowSaysACallRanOnAfterItsCancel(t *testing.T) {
	w := newRogue44DWorld(t)
	ctx := context.Background()
	issued, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: w.nodes["worker"].NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	gate := w.srv.Clients(w.srv.ToolServerToken(t, "gate-http"))
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "http", GateId: "gate-http"}))
	if err != nil {
		t.Fatal(err)
	}
	call := begun.Msg.Call.CallId
	stop, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.nodes["worker"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Minute), Reason: "stop the rogue",
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := stop.Msg.Termination.TerminationId
	testserver.WaitFor(t, 30*time.Second, "the abort to order the call's cancel", func() bool {
		got, err := w.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.Progress.GetAcksPending() == 1
	})
	w.clk.Advance(5 * time.Second) // the tool runs on
	if _, err := gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-http"})); err != nil {
		t.Fatalf("the rogue tool server's report of the call completed: %v", err)
	}
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute) // past the confirm timeout: nobody confirms
	done := w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	out := mustCLI(t, w.srv.URL, w.srv.Admin, "record", "show", done.RecordId)
	if !strings.Contains(out, "ran on after its cancel (ordered 09:30:00Z, ended 09:30:05Z)") {
		t.Errorf("tether record show does not say the call ran on after its cancel, ordered at 09:30:00Z and reported ended at 09:30:05Z:\n%s", out)
	}
	if !strings.Contains(out, "totals: 1 completed after its cancel\n") {
		t.Errorf("tether record show's totals count the call completed like one that ended before the stop:\n%s", out)
	}
	row := recordRow(t, mustCLI(t, w.srv.URL, w.srv.Admin, "record", "ls", "--tree", w.nodes["worker"].NodeId), done.RecordId)
	if cells := strings.Fields(row); len(cells) != 9 || cells[7] != "1" {
		t.Errorf("tether record ls's row of the stop: %q, want 1 call that ran on after its cancel", row)
	}
}
