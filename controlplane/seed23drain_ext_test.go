package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestADrainedAgentsRefusedCallSaysItsSubtreeIsStoppingAfterItsGrantsAreRevoked:
// a drain with nothing in flight revokes the subtree's grants at once, and
// an agent whose drain signal is slower than that revocation used to have
// its next call refused permission_denied ("grant revoked"): an SDK's
// "refused because draining" test (docs/integrating.md's Python loop) took
// it for a bad credential and raised, depending on which of the two reached
// it first. The refusal is failed_precondition naming the node's drain
// whichever came first, and it still says the token was refused; once the
// termination is over, the dead token is refused permission_denied.
func TestADrainedAgentsRefusedCallSaysItsSubtreeIsStoppingAfterItsGrantsAreRevoked(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	agent := register(t, admin, "planner")
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: agent.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	begin := func() error {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "search", GateId: "gate-1"}))
		return err
	}

	term := terminate(t, admin, agent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Hour)
	testserver.WaitFor(t, 20*time.Second, "the drain to revoke the agent's grant", func() bool {
		in, err := admin.Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{Token: issued.Msg.Token}))
		return err == nil && !in.Msg.Active && strings.Contains(in.Msg.Reason, "revoked")
	})
	if got := getTermination(t, admin, term.TerminationId).State; got == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
		t.Fatalf("the termination ended before the test's call; it waits an hour for the agent's exit")
	}
	err = begin()
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "draining") || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a call of a draining agent whose grant the drain revoked: %v; want failed_precondition saying the node is draining and its token was refused (revoked)", err)
	}

	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: agent.Node.NodeId, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if err := begin(); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a call with the revoked grant of a terminated agent: %v; want permission_denied (revoked)", err)
	}
}
