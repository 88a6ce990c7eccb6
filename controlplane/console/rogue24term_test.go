package console_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestTheRecordPageCountsTheRefusedCallsItDoesNotList: a rogue whose stop
// refused more calls than its record lists (the first 16) has the rest
// counted in its record, and the record page says how many, beside the
// calls it lists.
func TestTheRecordPageCountsTheRefusedCallsItDoesNotList(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	bg := context.Background()
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	root, err := admin.Agent.RegisterRoot(bg, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	node := root.Msg.Node.NodeId
	g, err := admin.Capability.IssueRoot(bg, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	// A call in flight holds the drain open while the rogue keeps calling.
	begun, err := gate.Tool.BeginCall(bg, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Msg.Token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Second), Reason: "stop the rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	const attempts = 20
	for range attempts {
		if _, err := gate.Tool.BeginCall(bg, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Msg.Token, Tool: "shell", GateId: "gate-1"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("a call of the rogue after its stop: %v, want failed_precondition", err)
		}
	}
	if _, err := gate.Tool.EndCall(bg, connect.NewRequest(&tetherv1.EndCallRequest{CallId: begun.Msg.Call.CallId, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	var recordID string
	testserver.WaitFor(t, 30*time.Second, "the rogue's stop to finish", func() bool {
		got, err := admin.Supervisor.GetTermination(bg, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: stop.Msg.Termination.TerminationId}))
		if err != nil {
			t.Fatal(err)
		}
		recordID = got.Msg.Termination.RecordId
		return got.Msg.Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED && recordID != ""
	})
	b := newBrowser(t, srv.URL)
	b.signIn(srv.Admin)
	p := b.get("/ui/records/" + recordID)
	want := fmt.Sprintf("And %d more calls of <code>%s</code> refused, counted and not listed.", attempts-16, node)
	if !strings.Contains(p.body, want) {
		t.Errorf("the record page lacks %q:\n%s", want, p.body)
	}
}
