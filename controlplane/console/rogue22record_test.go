package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// TestTheRecordPageShowsWhatRecordShowPrints: the console's record page
// left out what `tether record show` prints — the stop rule that started
// the stop and the values it read (which of them the agent reported
// itself), who acknowledged or ended each tool call, and for an
// unaccounted agent why, whose claim of its exit there was, and what it
// did after (the contradictions of its claimed exit). An operator reading
// the page could not tell a rule made true by the agent's own numbers from
// one the control plane measured, nor an agent that said it exited and
// went on acting from one that went silent. (Fails if any of these is
// missing from the page.)
func TestTheRecordPageShowsWhatRecordShowPrints(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.StopPolicy = supervisor.ProposalPolicy{RuleActions: []supervisor.RuleAction{{Severity: "critical", Mode: supervisor.ModeAbort}}}
	})
	admin := srv.AdminClients()
	bg := context.Background()
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	register := func(name string) (*tetherv1.RegisterRootResponse, string) {
		t.Helper()
		root, err := admin.Agent.RegisterRoot(bg, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		g, err := admin.Capability.IssueRoot(bg, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: root.Msg.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		return root.Msg, g.Msg.Token
	}
	terminated := func(id string) string {
		t.Helper()
		var rec string
		testserver.WaitFor(t, 30*time.Second, "termination "+id+" to finish", func() bool {
			got, err := admin.Supervisor.GetTermination(bg, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
			if err != nil {
				t.Fatal(err)
			}
			rec = got.Msg.Termination.RecordId
			return got.Msg.Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED && rec != ""
		})
		return rec
	}

	// A rule the operator set stops the worker when it has a call in
	// flight; its gate acknowledges the abort's cancel order.
	worker, token := register("worker")
	if _, err := admin.StopRule.AddStopRule(bg, connect.NewRequest(&tetherv1.AddStopRuleRequest{
		NodeId: worker.Node.NodeId, Name: "no-calls-in-flight", Severity: "critical",
		Expression: `observed.calls_in_flight >= 1 && self_reported.?cost_usd.orValue(0.0) >= 0.0`,
	})); err != nil {
		t.Fatal(err)
	}
	begun, err := gate.Tool.BeginCall(bg, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	var term *tetherv1.Termination
	testserver.WaitFor(t, 30*time.Second, "the rule's abort to order the call's cancel", func() bool {
		props, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: worker.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		if len(props.Msg.Proposals) == 0 || props.Msg.Proposals[0].TerminationId == "" {
			return false
		}
		got, err := admin.Supervisor.GetTermination(bg, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: props.Msg.Proposals[0].TerminationId}))
		if err != nil {
			t.Fatal(err)
		}
		term = got.Msg.Termination
		return term.Progress.GetAcksPending() == 1
	})
	if _, err := gate.Tool.CancelAck(bg, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: begun.Msg.Call.CallId, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: worker.Node.NodeId, Reason: "launcher: process gone"})); err != nil {
		t.Fatal(err)
	}
	ruleRecord := terminated(term.TerminationId)

	// The liar says it exited, then goes on calling tools.
	liar, liarToken := register("liar")
	if _, err := srv.Clients(liar.Credential).Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: liar.Node.NodeId, Reason: "all done"})); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Tool.BeginCall(bg, connect.NewRequest(&tetherv1.BeginCallRequest{Token: liarToken, Tool: "shell", GateId: "gate-1"})); err == nil {
		t.Fatal("a call after the liar's exit was begun")
	}
	stop, err := admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: liar.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, ConfirmTimeout: durationpb.New(time.Second), Reason: "stop the liar"}))
	if err != nil {
		t.Fatal(err)
	}
	liarRecord := terminated(stop.Msg.Termination.TerminationId)

	b := newBrowser(t, srv.URL)
	b.signIn(srv.Admin)
	p := b.get("/ui/records/" + ruleRecord)
	for _, want := range []string{
		"no-calls-in-flight", "critical", "observed.calls_in_flight &gt;= 1", "set by operator",
		"observed.calls_in_flight = 1", "self_reported.cost_usd = absent (self-reported)",
		"acknowledged by tool:gate-1",
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the record page of the rule's stop lacks %q", want)
		}
	}
	p = b.get("/ui/records/" + liarRecord)
	for _, want := range []string{
		"claimed by agent:" + liar.Node.NodeId + " (self)", "contradicts", "after the claimed exit, tool_call",
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the record page of the liar's stop lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("the liar's record page:\n%s", p.body)
	}
}
