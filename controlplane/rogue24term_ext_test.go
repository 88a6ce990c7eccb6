package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The twenty-fourth hostile pass over termination: what a rogue being
// stopped can hide from its record.

// TestARogueCannotHideHowManyCallsItsStopRefused: an operator stops a
// rogue; its gate keeps calling with the rogue's token while the stop is
// under way (40 attempts). Each is refused, and the record lists the first
// 16 (ledger.MaxRefusedCallsListedPerNode) as rejected_draining; the other
// 24 left no trace, so the record could not tell a stray call after the
// drain began from a rogue hammering its tools throughout. Now the record's
// entry for the node counts the refused calls it does not list.
func TestARogueCannotHideHowManyCallsItsStopRefused(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}

	held.hold()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	const attempts = 40
	for i := range attempts {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "shell", GateId: "gate-1"}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("attempt %d of the rogue's call after its stop was requested: %v, want failed_precondition", i+1, err)
		}
	}
	held.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, term.TerminationId)
	listed := 0
	for _, c := range rec.ToolCalls {
		if c.NodeId == rogue.Node.NodeId && c.Resolution == tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
			listed++
		}
	}
	var counted uint64
	for _, n := range rec.Nodes {
		if n.NodeId == rogue.Node.NodeId {
			counted = n.RefusedCallsNotListed
		}
	}
	if listed != ledger.MaxRefusedCallsListedPerNode || listed+int(counted) != attempts {
		t.Fatalf("the record lists %d of the rogue's refused calls and counts %d more; it made %d attempts, want %d listed and %d counted", listed, counted, attempts, ledger.MaxRefusedCallsListedPerNode, attempts-ledger.MaxRefusedCallsListedPerNode)
	}
}

// TestARogueSpawnsNoChildBetweenItsStopsRequestAndItsMark: the design
// promises that from a stop's request on no node of its subtree may
// spawn, however long the reconciler takes to begin the mark. While an
// operator's stop of the rogue is requested and not yet marked (a busy
// reconciler), the rogue spawns children: each is a new agent the stop
// must then mark, wait for and account for, made after the stop began.
// Each spawn is refused failed_precondition naming the termination, and
// the record lists the rogue alone.
func TestARogueSpawnsNoChildBetweenItsStopsRequestAndItsMark(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")
	held.hold()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	const attempts = 4
	spawned := 0
	for i := range attempts {
		for _, parent := range []*tetherv1.SpawnResponse{{Node: rogue.Node, Credential: rogue.Credential}, child} {
			_, err := srv.Clients(parent.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent.Node.NodeId, Name: fmt.Sprintf("late-%d", i)}))
			if err == nil {
				spawned++
				continue
			}
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), term.TerminationId) {
				t.Fatalf("a spawn under %s after its stop was requested: %v, want failed_precondition naming termination %s", parent.Node.NodeId, err, term.TerminationId)
			}
		}
	}
	if spawned > 0 {
		t.Fatalf("between the operator's stop request and its mark the rogue and its child spawned %d of %d children; want none", spawned, 2*attempts)
	}
	held.free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := len(record(t, admin, term.TerminationId).Nodes); got != 2 {
		t.Fatalf("the record lists %d nodes, want the rogue and its child", got)
	}
}

// TestARogueIsArmedWithNothingBetweenItsStopsRequestAndItsMark: from a
// stop's request on no node of its subtree may take a fresh token or be
// given a grant (design §4). While an operator's stop of the rogue is
// requested and not yet marked, the rogue refreshes its token and
// delegates a grant to its child: each is refused failed_precondition.
func TestARogueIsArmedWithNothingBetweenItsStopsRequestAndItsMark(t *testing.T) {
	held, srv := startHeldServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	rogue := register(t, admin, "rogue")
	child := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")
	issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: rogue.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	grant := issued.Msg.Grant.GrantId
	held.hold()
	terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	rc := srv.Clients(rogue.Credential)
	armed := []string{}
	if _, err := rc.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: grant})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		armed = append(armed, fmt.Sprintf("a fresh token (%v)", err))
	}
	if _, err := rc.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: grant, HolderNodeId: child.Node.NodeId, Scopes: []string{"tool:shell"}, Ttl: durationpb.New(30 * time.Minute)})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		armed = append(armed, fmt.Sprintf("a grant for its child (%v)", err))
	}
	if len(armed) > 0 {
		t.Fatalf("between the operator's stop request and its mark the rogue took %s; want each refused failed_precondition", strings.Join(armed, " and "))
	}
}
