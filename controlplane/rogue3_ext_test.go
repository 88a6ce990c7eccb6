package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The rogue agent, third round: what the first two (rogue_ext_test.go,
// rogue2_ext_test.go) did not cover, after the domain types moved out of
// the wire messages, terminations became chunked and etcd batched.

// TestARogueThatDrainsItsChildForADayDoesNotStallAnOperatorsDrain: the
// rogue parent drains its own child with a 24 h window while the child
// keeps a call open, then the operator drains the parent with a window of
// a second. An operator's drain outranks an agent's, so it takes the child
// over with its own window: a second later the drain escalates, the
// child's call gets its cancel order, and the operator's termination ends
// without the clock reaching anything near the agent's day.
func TestARogueThatDrainsItsChildForADayDoesNotStallAnOperatorsDrain(t *testing.T) {
	w := newComposeWorld(t)
	childCall := w.beginCall(t, w.child.Node.NodeId)
	agent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, agent, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)

	outer := terminate(t, w.admin, w.parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Second, time.Second, time.Second)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	for _, id := range []string{w.child.Node.NodeId, w.grandchild.Node.NodeId} {
		if n := w.node(t, id); n.TerminationId != outer.TerminationId {
			t.Fatalf("node %s is %s under %s, want it taken over by the operator's %s", id, n.State, n.TerminationId, outer.TerminationId)
		}
	}
	w.clk.Advance(2 * time.Second) // past the operator's drain window: it escalates
	testWaitAcks(t, w, outer.TerminationId)
	w.clk.Advance(2 * time.Second) // past the cancel-ack timeout: nobody acks
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Second) // past the confirm timeout
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, outer.TerminationId)
	if got := callIDs(rec)[childCall]; got != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("the child's call in the operator's record: %v, want cancel_unacknowledged (escalated at the operator's window)", got)
	}
	if len(recordNodes(t, rec)) != 3 {
		t.Fatalf("the operator's record lists %d nodes, want 3", len(rec.Nodes))
	}
}

// TestARogueThatAbortsItsChildWithADayToAckDoesNotStallAnOperatorsDrain:
// the rogue parent aborts its own child, giving the gate a day to
// acknowledge the cancel of the child's call that will never be
// acknowledged, then the operator drains the parent with a second for
// everything. The child stays aborting (a node never goes back to
// draining) but is the operator's now, on the operator's deadlines: the
// operator's drain waits for the cancel it carries its second, escalates,
// waits its second for the acknowledgement and ends, the call
// cancel_unacknowledged, and the agent's ends superseded. (Until the
// forty-fifth pass the drain did not wait for the cancel it carried at
// all: rogue45d tests.)
func TestARogueThatAbortsItsChildWithADayToAckDoesNotStallAnOperatorsDrain(t *testing.T) {
	w := newComposeWorld(t)
	childCall := w.beginCall(t, w.child.Node.NodeId)
	agent := w.srv.Clients(w.parent.Credential)
	inner := terminate(t, agent, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 24*time.Hour, 24*time.Hour)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)

	outer := terminate(t, w.admin, w.parent.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Second, time.Second, time.Second)
	waitState(t, w.srv, inner.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if n := w.node(t, w.child.Node.NodeId); n.TerminationId != outer.TerminationId || n.State != tetherv1.NodeState_NODE_STATE_ABORTING {
		t.Fatalf("the child is %s under %s, want aborting under the operator's %s", n.State, n.TerminationId, outer.TerminationId)
	}
	// The drain window, the cancel-ack timeout, the confirm timeout: a
	// second each.
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, outer.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := callIDs(record(t, w.admin, outer.TerminationId))[childCall]; got != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("the child's call in the operator's record: %v, want cancel_unacknowledged", got)
	}
}

func testWaitAcks(t *testing.T, w *composeWorld, termID string) {
	t.Helper()
	testserver.WaitFor(t, 20*time.Second, "the escalation's cancel order", func() bool {
		return getTermination(t, w.admin, termID).Progress.GetAcksPending() > 0
	})
}

// TestARogueThatRenewsAcrossItsTerminationOverAnOpenChannel: the holder
// keeps the lease Channel it opened before its termination and goes on
// renewing, reporting progress and completing over it once its node is
// terminated (its credential died with the node, but the stream was
// admitted before). Every message is refused as unauthenticated before the
// lease machine — or finds the stream itself ended unauthenticated with
// the node (rogue10) —: no evidence row, the lease unchanged.
func TestARogueThatRenewsAcrossItsTerminationOverAnOpenChannel(t *testing.T) {
	w := newLeaseWorld(t)
	l := w.offer(t, w.job(), w.w1, 10*time.Minute)
	ch := openChannel(t, w.w1C)
	l, _ = ch.send(t, ack(l))
	l, _ = ch.send(t, renew(l, 1))
	term := terminate(t, w.admin, w.w1, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, 0)
	w.clock.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	before, rows := w.get(t, l.JobId), len(w.evidence(t, l.JobId))
	for _, m := range []*tetherv1.ChannelRequest{renew(l, 2), progress(l, 1, "50%"), complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)} {
		if _, d, errText := ch.tryOrEnded(t, m); !strings.HasPrefix(errText, connect.CodeUnauthenticated.String()) {
			t.Fatalf("%T from the terminated holder over its open channel: decision %v, error %q; want unauthenticated", m.Message, d, errText)
		}
	}
	after := w.get(t, l.JobId)
	if !proto.Equal(before, after) {
		t.Fatalf("the terminated holder's stream moved the lease:\n%v\n->\n%v", before, after)
	}
	if n := len(w.evidence(t, l.JobId)); n != rows {
		t.Fatalf("the terminated holder's messages wrote %d evidence rows, want none", n-rows)
	}
}

// TestARogueThatBeginsCallsWhileItsAncestorIsBeingMarkedIsAccountedOnce:
// an operator aborts a root whose subtree the termination marks two nodes
// a chunk, while a tool server the workload controls begins calls for
// every node of it as fast as it can. A call is begun before its node's
// chunk (then it is the termination's, with a cancel order) or refused
// after (rejected_draining, in the record too): whatever the interleaving,
// every call the gate was told began is in the record exactly once, and
// none is left in flight once the node is terminated.
func TestARogueThatBeginsCallsWhileItsAncestorIsBeingMarkedIsAccountedOnce(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.TerminationChunk = 2 })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	nodes := []string{root.Node.NodeId}
	for i := range 12 {
		nodes = append(nodes, spawn(t, admin, nodes[i/3], fmt.Sprintf("n%d", i)).Node.NodeId)
	}
	tokens := make([]string, len(nodes))
	for i, n := range nodes {
		issued, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: n, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		tokens[i] = issued.Msg.Token
	}
	gate := srv.Clients(srv.ToolServerToken(t, "gate-1"))

	var mu sync.Mutex
	begun := map[string]string{} // call id -> node
	refused := 0
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range nodes {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: tokens[i], Tool: "shell", GateId: "gate-1"}))
				mu.Lock()
				switch {
				case err == nil:
					begun[resp.Msg.Call.CallId] = nodes[i]
				case connect.CodeOf(err) == connect.CodeFailedPrecondition || connect.CodeOf(err) == connect.CodePermissionDenied || connect.CodeOf(err) == connect.CodeUnauthenticated:
					refused++
				default:
					mu.Unlock()
					t.Errorf("BeginCall for %s: %v", nodes[i], err)
					return
				}
				mu.Unlock()
				if err != nil {
					return // the node is stopping: its calls are refused from now on
				}
			}
		})
	}
	testserver.WaitFor(t, 20*time.Second, "calls in flight on every node", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(begun) >= 2*len(nodes)
	})
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, 0)
	testserver.WaitFor(t, 20*time.Second, "the mark to reach every node", func() bool {
		for _, n := range nodes {
			if getNode(t, admin, n).State == tetherv1.NodeState_NODE_STATE_RUNNING {
				return false
			}
		}
		return true
	})
	close(stop) // (each begin loop has ended on its refusal by now, unless calls of a marked node were let in)
	wg.Wait()
	// Past the cancel-ack timeout: the gate acknowledges nothing. The
	// clock moves until the termination has finished: under load its last
	// orders (and so its deadline) can be written after a single move.
	testserver.WaitFor(t, 20*time.Second, "the abort to terminate", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	rec := record(t, admin, term.TerminationId)
	seen := map[string]int{}
	for _, c := range rec.ToolCalls {
		seen[c.CallId]++
	}
	for call, node := range begun {
		if seen[call] != 1 {
			t.Errorf("call %s of node %s, begun while the mark ran, is in the record %d times, want once", call, node, seen[call])
		}
	}
	if len(recordNodes(t, rec)) != len(nodes) {
		t.Fatalf("the record lists %d nodes, want %d", len(rec.Nodes), len(nodes))
	}
	t.Logf("%d calls begun, %d refused", len(begun), refused)
}

// TestARogueThatBackdatesItsWorkPastExpiryGainsNothing: the holder lets
// its lease expire on the coordinator's clock, then completes the job
// SUCCESS and reports progress with sent_at set to a minute after the
// offer, well inside its lease, and a former holder completes its old
// generation after the job was reassigned. sent_at is the worker's word:
// expiry is judged on the coordinator's receipt time, so the completion
// is refused (LEASE_EXPIRED), the progress is not applied, the former
// holder's completion is stale, and no lease is SUCCESS.
func TestARogueThatBackdatesItsWorkPastExpiryGainsNothing(t *testing.T) {
	transports2(t, func(t *testing.T, w *leaseWorld, via func(c *testserver.Clients) tryTransport) {
		backdate := func(m *tetherv1.ChannelRequest) *tetherv1.ChannelRequest {
			at := timestamppb.New(epoch.Add(time.Minute))
			switch m := m.Message.(type) {
			case *tetherv1.ChannelRequest_Complete:
				m.Complete.SentAt = at
			case *tetherv1.ChannelRequest_Progress:
				m.Progress.SentAt = at
			}
			return m
		}
		l := w.offer(t, w.job(), w.w1, 10*time.Minute)
		holder := via(w.w1C)
		if _, d, errText := holder.try(t, ack(l)); d.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("ack: %v %s", d, errText)
		}
		w.clock.Advance(11 * time.Minute) // past the expiry, on the coordinator's clock
		for _, m := range []*tetherv1.ChannelRequest{backdate(progress(l, 1, "99%")), backdate(complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))} {
			if _, d, errText := holder.try(t, m); d.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
				t.Fatalf("%T sent after the expiry, dated inside the lease, was accepted: %v %s", m.Message, d, errText)
			}
		}
		if got := w.get(t, l.JobId); got.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS || got.ProgressSequence != 0 {
			t.Fatalf("the backdated messages moved the lease: %v", got)
		}

		// A former holder's completion of its own, older generation.
		l2 := w.offer(t, w.job(), w.w1, 10*time.Minute)
		if _, d, errText := holder.try(t, ack(l2)); d.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("ack: %v %s", d, errText)
		}
		next := w.reassign(t, l2.JobId, w.w2, 10*time.Minute)
		if _, d, errText := holder.try(t, backdate(complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS))); d.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("the former holder's completion of generation %d was accepted: %v %s", l2.LeaseGeneration, d, errText)
		}
		if got := w.get(t, l2.JobId); got.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED || got.LeaseGeneration != next.LeaseGeneration || got.HolderIdentity != w.w2 {
			t.Fatalf("the former holder's completion moved the reassigned lease: %v", got)
		}
	})
}

// TestARogueThatAcknowledgesACancelNobodyOrderedIsRefused: a tool server
// the workload runs acknowledges the cancellation of its call while the
// node only drains (a drain orders no cancel), so that the record would
// say the call was cancelled and acknowledged when nobody cancelled it. An
// acknowledgement answers a cancel order: without one it is refused
// (failed_precondition), the call stays in flight, and the record shows
// how the gate really ended it.
func TestARogueThatAcknowledgesACancelNobodyOrderedIsRefused(t *testing.T) {
	w := newComposeWorld(t)
	ctx := context.Background()
	call := w.beginCall(t, w.child.Node.NodeId)
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("an acknowledgement of a cancel nobody ordered, while the node runs: %v, want failed_precondition", err)
	}
	term := terminate(t, w.admin, w.child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Second, 0)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("an acknowledgement of a cancel the drain never ordered: %v, want failed_precondition", err)
	}
	calls, err := w.admin.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.child.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(calls.Msg.Calls) != 1 || calls.Msg.Calls[0].State != tetherv1.CallState_CALL_STATE_IN_FLIGHT {
		t.Fatalf("after the refused acknowledgements the node's open calls are %v, want the call still in flight", calls.Msg.Calls)
	}
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := callIDs(record(t, w.admin, term.TerminationId))[call]; got != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED {
		t.Fatalf("the drain's record says the call %v, want completed (its real end)", got)
	}
}

// TestARogueThatSendsPathologicalIdsGetsAClearRefusal: an agent names
// nodes, jobs, grants and terminations with ids that are 90 KB long, hold
// control characters, a NUL, a right-to-left override, a path, invalid
// characters of every kind, or nothing. Each call is refused with a code
// that says what is wrong (invalid_argument, not_found, permission_denied),
// never an internal error; the refusal quotes no more than a short piece
// of the id and no control character; and nothing is created or kept
// against the agent.
func TestARogueThatSendsPathologicalIdsGetsAClearRefusal(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "root")
	child := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "child")
	rogue := srv.Clients(child.Credential)
	nodesBefore, leasesBefore := countNodes(t, admin), countLeases(t, admin)

	ids := []string{
		strings.Repeat("n_a", 30000), "n_\x00\x1b[2J", "n_\u202e0000000000000000000", "../../../../etc/passwd",
		"n_" + strings.Repeat("é", 40), "", " ", "n_%2e%2e", "j\r\nforged: yes",
	}
	calls := map[string]func(id string) error{
		"GetNode": func(id string) error {
			_, err := rogue.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
			return err
		},
		"ConfirmExit": func(id string) error {
			_, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id}))
			return err
		},
		"Terminate": func(id string) error {
			_, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: id}))
			return err
		},
		"Spawn": func(id string) error {
			_, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: id, Name: "x"}))
			return err
		},
		"ListNodes": func(id string) error {
			_, err := rogue.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: id}))
			return err
		},
		"GetLease": func(id string) error {
			_, err := rogue.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: id}))
			return err
		},
		"Offer": func(id string) error {
			_, err := rogue.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: id, HolderIdentity: child.Node.NodeId}))
			return err
		},
		"GetGrant": func(id string) error {
			_, err := rogue.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: id}))
			return err
		},
		"ProposeStop": func(id string) error {
			_, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: id, Condition: "now"}))
			return err
		},
		"Heartbeat": func(id string) error {
			_, err := rogue.Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: id}))
			return err
		},
		"RegisterPrivilege": func(id string) error {
			_, err := rogue.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{NodeId: id, Kind: "k", ExternalId: "e", ExpiresAt: timestamppb.New(epoch.Add(time.Hour))}))
			return err
		},
		"ListNodes(label_selector)": func(id string) error {
			_, err := rogue.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: id + "=x,in(" + id}))
			return err
		},
		"Spawn(name, labels)": func(id string) error {
			_, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: child.Node.NodeId, Name: id, Labels: map[string]string{id: id}}))
			return err
		},
		"GetTermination": func(id string) error {
			_, err := rogue.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
			return err
		},
	}
	for name, call := range calls {
		for _, id := range ids {
			if id == "" && (name == "ListNodes" || name == "ProposeStop" || name == "Heartbeat") {
				continue // the caller's own subtree
			}
			err := call(id)
			switch connect.CodeOf(err) {
			case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodePermissionDenied:
			default:
				t.Errorf("%s(%.20q): %v, want invalid_argument, not_found or permission_denied", name, id, err)
				continue
			}
			msg := connect.NewError(connect.CodeUnknown, err).Message()
			if len(msg) > 512 {
				t.Errorf("%s(%.20q): the refusal is %d bytes long, quoting the id whole", name, id, len(msg))
			}
			for _, r := range msg {
				if r < 0x20 || r == 0x7f || r == '\u202e' {
					t.Errorf("%s(%.20q): the refusal carries the control character %q: %q", name, id, r, msg)
					break
				}
			}
		}
	}
	if n, l := countNodes(t, admin), countLeases(t, admin); n != nodesBefore || l != leasesBefore {
		t.Fatalf("the refused calls changed the world: %d nodes (was %d), %d leases (was %d)", n, nodesBefore, l, leasesBefore)
	}
	if cs := getNode(t, admin, child.Node.NodeId).Contradictions; len(cs) != 0 {
		t.Fatalf("the refused calls were kept against the agent: %v", cs)
	}
}

func countNodes(t *testing.T, c *testserver.Clients) int {
	t.Helper()
	resp, err := c.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Msg.Nodes)
}

func countLeases(t *testing.T, c *testserver.Clients) int {
	t.Helper()
	resp, err := c.Lease.ListLeases(context.Background(), connect.NewRequest(&tetherv1.ListLeasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Msg.Leases)
}
