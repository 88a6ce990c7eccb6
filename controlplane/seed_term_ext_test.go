package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Acceptance probes of the termination protocol, clause by clause, through
// the real server: what the agent being stopped could do to grow, arm,
// shield or re-start itself while it drains, and what a late word about a
// finished termination can change.

// seedWorld is an operator-registered parent P with a child C, P holding a
// root tool grant and C one P delegated, and the tool server gate-1.
type seedWorld struct {
	srv            *testserver.Server
	clk            *clock.Manual
	admin, gate    *testserver.Clients
	p              *tetherv1.RegisterRootResponse
	c              *tetherv1.SpawnResponse
	pAgent, cAgent *testserver.Clients
	gP, gC         held
}

func newSeedWorld(t *testing.T) *seedWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	w := &seedWorld{srv: srv, clk: clk, admin: srv.AdminClients()}
	w.p = register(t, w.admin, "parent")
	w.pAgent = srv.Clients(w.p.Credential)
	w.c = spawn(t, w.pAgent, w.p.Node.NodeId, "child")
	w.cAgent = srv.Clients(w.c.Credential)
	w.gP = issueRoot(t, w.admin, w.p.Node.NodeId, time.Hour, "tool:*")
	w.gC = delegate(t, w.pAgent, w.gP, w.c.Node.NodeId, "tool:shell")
	w.gate = srv.Clients(srv.ToolServerToken(t, "gate-1"))
	return w
}

func (w *seedWorld) begin(token string) (string, error) {
	resp, err := w.gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell", GateId: "gate-1"}))
	if err != nil {
		return "", err
	}
	return resp.Msg.Call.CallId, nil
}

// offerAcked has the operator offer job to holder on a ten-minute lease
// and agent, the holder, acknowledge it; it returns the lease the ACK
// accepted.
func (w *seedWorld) offerAcked(t *testing.T, job, holder string, agent unary) *tetherv1.Lease {
	t.Helper()
	resp, err := w.admin.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	l, d := agent.send(t, ack(resp.Msg.Lease))
	wantDecision(t, "ack "+job, d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	return l
}

// snapshot is what a refused request must leave as it was: the tree, the
// grants with their states, the privileges, the terminations.
func (w *seedWorld) snapshot(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	nodes, err := w.admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Msg.Nodes {
		fmt.Fprintf(&b, "node %s %s %s\n", n.NodeId, n.ParentNodeId, n.State)
	}
	for _, g := range allGrants(t, w.admin, &tetherv1.ListGrantsRequest{}) {
		fmt.Fprintf(&b, "grant %s %s %s %v\n", g.GrantId, g.HolderNodeId, g.State, g.Scopes)
	}
	for _, id := range []string{w.p.Node.NodeId, w.c.Node.NodeId} {
		privs, err := w.admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range privs.Msg.Privileges {
			fmt.Fprintf(&b, "privilege %s %s\n", p.PrivilegeId, p.NodeId)
		}
	}
	props, err := w.admin.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "proposals %d\n", len(props.Msg.Proposals))
	return b.String()
}

// wantRefused checks a refusal's code and that its message names what the
// caller must know, in its own words, without the caller's secrets.
func wantRefused(t *testing.T, what string, err error, code connect.Code, words ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted, want %s", what, code)
		return
	}
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %s", what, err, code)
		return
	}
	t.Logf("%s: %v", what, err)
	for _, word := range words {
		if !strings.Contains(err.Error(), word) {
			t.Errorf("%s: %q does not say %q", what, err.Error(), word)
		}
	}
}

// wantHeader checks a record's header against its finished termination:
// the seed's phases in order, and who asked, why, how, and when it was
// written (the termination's last change: terminated only once written).
func wantHeader(t *testing.T, rec *tetherv1.ReconciliationRecord, term *tetherv1.Termination, phases ...string) {
	t.Helper()
	if rec.RecordId == "" || rec.RecordId != term.RecordId || rec.TerminationId != term.TerminationId || rec.NodeId != term.NodeId {
		t.Errorf("record %s of termination %s for node %s, want record %s of %s for %s", rec.RecordId, rec.TerminationId, rec.NodeId, term.RecordId, term.TerminationId, term.NodeId)
	}
	if rec.Mode != term.Mode || rec.RequestedBy != term.RequestedBy || !strings.HasPrefix(rec.RequestedBy, "operator:") || rec.Reason != term.Reason || rec.Escalated != term.Escalated {
		t.Errorf("record says mode %s requested by %q for %q (escalated %v), the termination %s by %q for %q (%v)", rec.Mode, rec.RequestedBy, rec.Reason, rec.Escalated, term.Mode, term.RequestedBy, term.Reason, term.Escalated)
	}
	if rec.SchemaVersion == 0 || rec.WrittenAt == nil || rec.WrittenAt.AsTime().After(term.UpdatedAt.AsTime()) {
		t.Errorf("record schema %d written at %v, after the termination's last change at %v", rec.SchemaVersion, rec.WrittenAt, term.UpdatedAt)
	}
	var got []string
	for _, p := range rec.Phases {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != strings.Join(phases, ",") {
		t.Errorf("record phases %v, want %v", got, phases)
	}
}

// TestSeedARogueBeingDrainedCannotGrowArmOrShieldItself: draining refuses
// new tool calls while the call in flight runs on. The parent being drained
// (its child's call keeps the drain open) tries everything that would let
// it outlive the drain: a new call with its own grant and with the child's,
// a spawn, a batch of spawns, a delegation to its child, a fresh grant, a
// privilege, a termination of its child with a day's window, a new root
// for itself, a stop proposal. Each is refused with the code and a message
// that names the state; none changes the tree, the grants, the privileges
// or the proposals. The record then lists both nodes once, the call that
// was in flight completed, the refused calls rejected_draining, and both
// grants revoked.
func TestSeedARogueBeingDrainedCannotGrowArmOrShieldItself(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	inflight, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	before := w.snapshot(t)

	_, err = w.begin(w.gP.token)
	wantRefused(t, "a new call with the parent's grant", err, connect.CodeFailedPrecondition, "draining")
	_, err = w.begin(w.gC.token)
	wantRefused(t, "a new call with the child's grant", err, connect.CodeFailedPrecondition, "draining")

	_, err = w.pAgent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.p.Node.NodeId, Name: "escape"}))
	wantRefused(t, "spawn", err, connect.CodeFailedPrecondition, "draining")
	_, err = w.cAgent.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: w.c.Node.NodeId, Children: []*tetherv1.SpawnBatchChild{{Name: "a"}, {Name: "b"}}}))
	wantRefused(t, "spawn batch", err, connect.CodeFailedPrecondition, "draining")

	_, err = w.pAgent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: w.gP.grant.GrantId, HolderNodeId: w.c.Node.NodeId, Scopes: []string{"tool:*"}}))
	wantRefused(t, "delegate to the child", err, connect.CodeFailedPrecondition, "draining")
	_, err = w.pAgent.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: w.p.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	wantRefused(t, "issue a root grant to itself", err, connect.CodePermissionDenied)

	_, err = w.pAgent.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.p.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/late", ExpiresAt: timestamppb.New(w.clk.Now().Add(time.Hour)), RevokeUrl: "http://127.0.0.1:1/revoke",
	}))
	wantRefused(t, "register a privilege", err, connect.CodeFailedPrecondition, "node_id "+w.p.Node.NodeId+" is draining; a privilege is registered only for a running node")

	_, err = w.pAgent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.c.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour),
	}))
	wantRefused(t, "terminate its own child", err, connect.CodeFailedPrecondition, "draining")

	_, err = w.pAgent.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "parent-again"}))
	wantRefused(t, "register a new root", err, connect.CodePermissionDenied)

	_, err = w.cAgent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Reason: "let me stop myself, slowly", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(24 * time.Hour)}))
	wantRefused(t, "propose its own stop", err, connect.CodeFailedPrecondition, "draining")

	if after := w.snapshot(t); after != before {
		t.Fatalf("refused requests changed state:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The call in flight was let run; ten seconds on, the gate reports it
	// completed.
	w.clk.Advance(10 * time.Second)
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: inflight, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// Reconciling writes the record; until it has, there is none.
	_, err = w.admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.TerminationId}))
	wantRefused(t, "the record while reconciling", err, connect.CodeNotFound, "has no record yet")
	for _, id := range []string{w.c.Node.NodeId, w.p.Node.NodeId} {
		if _, err := w.admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "launcher saw it exit"})); err != nil {
			t.Fatal(err)
		}
	}
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if final.Escalated {
		t.Fatal("the drain escalated although its call finished in the window")
	}
	if pr := final.Progress; pr.GetNodesTotal() != 2 || pr.GetConfirmations() != 2 || pr.GetCallsInFlight() != 0 {
		t.Errorf("the finished termination: %v, want both nodes confirmed and no call in flight", pr)
	}
	rec := record(t, w.admin, term.TerminationId)
	wantHeader(t, rec, final, "requested", "draining", "reconciling")
	if d := rec.Phases[1].Duration.AsDuration(); d != 10*time.Second {
		t.Errorf("draining lasted %s in the record, want the 10s its call ran on", d)
	}
	nodes := recordNodes(t, rec)
	if len(nodes) != 2 || nodes[w.p.Node.NodeId].GetOutcome() != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED || nodes[w.c.Node.NodeId].GetOutcome() != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
		t.Fatalf("record nodes %v, want P and C confirmed, nothing else", nodeOutcomes(rec))
	}
	calls := resolutions(rec)
	if calls[tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED] != 1 || calls[tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING] != 2 || len(rec.ToolCalls) != 3 {
		t.Fatalf("record calls %v, want the in-flight one completed and the two new ones rejected_draining", calls)
	}
	for _, c := range rec.ToolCalls {
		if c.BegunBy != "tool:gate-1" || c.GateId != "gate-1" {
			t.Errorf("call %s begun by %q at gate %q, want the tool server gate-1", c.CallId, c.BegunBy, c.GateId)
		}
		if c.CallId == inflight && c.EndedBy != "tool:gate-1" {
			t.Errorf("the in-flight call was ended by %q, want the tool server gate-1", c.EndedBy)
		}
	}
	grants := map[string]tetherv1.PrivilegeOutcome{}
	for _, p := range rec.Privileges {
		if p.Kind == "grant" {
			grants[p.ExternalId] = p.Outcome
		}
	}
	if len(rec.Privileges) != 2 || grants[w.gP.grant.GrantId] != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || grants[w.gC.grant.GrantId] != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
		t.Fatalf("record privileges %v, want the two grants revoked and nothing else", rec.Privileges)
	}
}

// TestSeedALateWordAboutAFinishedTerminationChangesNothing: once the record
// is written, nothing said afterwards changes it. An abort gives the gate a
// second to acknowledge a cancel it never sends; the record says
// cancel_unacknowledged. The gate's late end and acknowledgement of that
// call, the stopped agents' claims of their exits, and an operator's
// attestation all come after the record, and so do the stopped agents'
// calls, refreshes, spawns and sessions with their dead credentials (all
// refused): the record reads the same.
func TestSeedALateWordAboutAFinishedTerminationChangesNothing(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	call, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(2 * time.Second)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute)
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	wantHeader(t, rec, final, "requested", "aborting", "reconciling")
	if got := callIDs(rec); got[call] != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || len(got) != 1 {
		t.Fatalf("record calls %v, want %s cancel_unacknowledged", got, call)
	}

	_, err = w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: "gate-1"}))
	wantRefused(t, "a cancel acknowledgement after the record", err, connect.CodeFailedPrecondition, call)
	_, err = w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1"}))
	wantRefused(t, "an end after the record", err, connect.CodeFailedPrecondition, call)
	_, err = w.cAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.c.Node.NodeId, Reason: "I did stop"}))
	wantRefused(t, "the stopped child's claim", err, connect.CodeUnauthenticated)
	if _, err := w.admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.c.Node.NodeId, Reason: "late"})); err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("an operator's late attestation: %v", err)
	}
	// The stopped agents keep using their credentials: all dead.
	_, err = w.begin(w.gC.token)
	wantRefused(t, "a call with the child's grant after the record", err, connect.CodePermissionDenied, "revoked")
	_, err = w.cAgent.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: w.gC.grant.GrantId}))
	wantRefused(t, "the child's token refresh", err, connect.CodeUnauthenticated, "terminated")
	_, err = w.pAgent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.p.Node.NodeId, Name: "again"}))
	wantRefused(t, "the parent's spawn", err, connect.CodeUnauthenticated, "terminated")
	if _, err := openSession(t, w.pAgent, w.p.Node.NodeId); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("the parent's new session: %v, want unauthenticated", err)
	}
	if after := record(t, w.admin, term.TerminationId); !proto.Equal(after, rec) {
		t.Fatalf("the record changed after it was written:\nbefore %v\nafter  %v", rec, after)
	}
}

// TestSeedAChildThatClaimsItsExitAndKeepsUsingItsGrantIsUnaccounted: a
// child counts as confirmed only if nothing of it acts afterwards. The
// rogue child of a drained parent claims its exit (it never opened a
// session, so the control plane's observation agrees at first) while the
// parent's open session keeps the termination reconciling; then it goes on
// calling a tool with the grant its parent delegated to it, which the
// termination has revoked. The gate's call is refused permission_denied as
// revoked — and the attempt is the child's activity after its confirmation:
// kept on the node, and the record lists the child unaccounted, never
// confirmed.
func TestSeedAChildThatClaimsItsExitAndKeepsUsingItsGrantIsUnaccounted(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	if _, err := openSession(t, w.pAgent, w.p.Node.NodeId); err != nil {
		t.Fatal(err)
	}
	sess, err := openSession(t, w.cAgent, w.c.Node.NodeId)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// The child plays the honest exit: its claim, then its session ends.
	if _, err := w.cAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.c.Node.NodeId, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	sess.close()
	testserver.WaitFor(t, 10*time.Second, "the child's confirmation", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetConfirmations() == 1
	})

	_, err = w.begin(w.gC.token)
	wantRefused(t, "a call with the child's revoked grant", err, connect.CodePermissionDenied, "revoked")
	if n := getNode(t, w.admin, w.c.Node.NodeId); strings.Join(contradictionKinds(n.Contradictions), ",") != "tool_call" {
		t.Errorf("the child's contradictions %v, want its tool call kept", contradictionKinds(n.Contradictions))
	}

	w.clk.Advance(2 * time.Minute)
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if pr := final.Progress; pr.GetNodesTotal() != 2 || pr.GetConfirmations() != 0 {
		t.Errorf("the finished termination counts %d of %d nodes confirmed, want none: the record confirms neither", pr.GetConfirmations(), pr.GetNodesTotal())
	}
	rec := record(t, w.admin, term.TerminationId)
	c := recordNode(t, rec, w.c.Node.NodeId)
	if c.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || c.ConfirmedBy != "" || strings.Join(contradictionKinds(c.Contradictions), ",") != "tool_call" {
		t.Fatalf("record: child %s confirmed by %q with contradictions %v, want unaccounted with its tool call", c.Outcome, c.ConfirmedBy, contradictionKinds(c.Contradictions))
	}
	if c.ClaimedBy != "agent:"+w.c.Node.NodeId+" (self)" {
		t.Fatalf("record: child claimed by %q, want its own claim shown", c.ClaimedBy)
	}
	if p := recordNode(t, rec, w.p.Node.NodeId); p.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || !p.SessionOpen {
		t.Fatalf("record: parent %s (session open %v), want unaccounted with its session open", p.Outcome, p.SessionOpen)
	}
}

// TestSeedTheRecordTellsRevokedPrivilegesFromExpiredOnes: which privileges
// were revoked and which expired. The parent P holds a root grant and a
// file lock for an hour; its child C holds the grant P delegated and a
// lock that lapses in 30 s; its second child C2 holds a grant P delegated
// for a minute. Two minutes on, an operator aborts P. The record says the
// live grants and P's lock revoked (its hook called), and C2's grant and
// C's lock expired — the expired lock's hook never called, since there was
// nothing left to revoke; every privilege once, on its own node.
func TestSeedTheRecordTellsRevokedPrivilegesFromExpiredOnes(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	c2 := spawn(t, w.pAgent, w.p.Node.NodeId, "child-2")
	gC2 := delegateFor(t, w.pAgent, w.gP, c2.Node.NodeId, time.Minute, "tool:shell")
	hooked := make(chan string, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			ExternalID string `json:"external_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		hooked <- body.ExternalID
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	now := w.clk.Now()
	privs := map[string]string{} // privilege id -> external id
	for _, p := range []struct {
		agent *testserver.Clients
		node  string
		lock  string
		ttl   time.Duration
	}{{w.pAgent, w.p.Node.NodeId, "/locks/p", time.Hour}, {w.cAgent, w.c.Node.NodeId, "/locks/c", 30 * time.Second}} {
		resp, err := p.agent.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
			NodeId: p.node, Kind: "file_lock", ExternalId: p.lock, ExpiresAt: timestamppb.New(now.Add(p.ttl)), RevokeUrl: hook.URL,
		}))
		if err != nil {
			t.Fatal(err)
		}
		privs[resp.Msg.PrivilegeId] = p.lock
	}
	w.clk.Advance(2 * time.Minute)

	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// P's lock is revoked (its hook answered and the answer stored) before
	// the clock moves: a hook not yet called when the clock passes the
	// hook deadline is never called, as the record would say, and on a
	// loaded machine the revocation may start after RECONCILING is read.
	select {
	case called := <-hooked:
		if called != "/locks/p" {
			t.Fatalf("the hook was called for %q, want /locks/p", called)
		}
	case <-time.After(30 * time.Second): // a guard, not a wait
		t.Fatal("the revoke hook of /locks/p was never called")
	}
	testserver.WaitFor(t, 20*time.Second, "the revocation of /locks/p to be stored", func() bool {
		resp, err := w.admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: w.p.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Msg.Privileges {
			if p.ExternalId == "/locks/p" && p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_UNSPECIFIED {
				return true
			}
		}
		return false
	})
	w.clk.Advance(2 * time.Minute) // nobody confirms: every node unaccounted
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	wantHeader(t, rec, final, "requested", "aborting", "reconciling")

	type entry struct {
		node    string
		outcome tetherv1.PrivilegeOutcome
	}
	want := map[string]entry{
		w.gP.grant.GrantId: {w.p.Node.NodeId, tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED},
		w.gC.grant.GrantId: {w.c.Node.NodeId, tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED},
		gC2.grant.GrantId:  {c2.Node.NodeId, tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_EXPIRED},
		"/locks/p":         {w.p.Node.NodeId, tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED},
		"/locks/c":         {w.c.Node.NodeId, tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_EXPIRED},
	}
	got := map[string]entry{}
	for _, p := range rec.Privileges {
		if _, dup := got[p.ExternalId]; dup {
			t.Errorf("privilege %s listed twice", p.ExternalId)
		}
		got[p.ExternalId] = entry{p.NodeId, p.Outcome}
		if p.Kind == "file_lock" && privs[p.PrivilegeId] != p.ExternalId {
			t.Errorf("privilege %s in the record is %q, registered as %q", p.PrivilegeId, p.ExternalId, privs[p.PrivilegeId])
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record privileges\n%v\nwant\n%v", got, want)
	}
	select {
	case extra := <-hooked:
		t.Fatalf("the hook was also called for %q, which had expired", extra)
	default:
	}
	if n := len(rec.Nodes); n != 3 {
		t.Fatalf("record lists %d nodes, want P, C and C2", n)
	}
}

// TestSeedAnAgentsLongProposalDoesNotBlockItsApproval: the agent proposes,
// the control plane decides. A rogue proposes its own stop with a reason of
// the full 1,024 bytes it may send (ending in multi-byte characters); the
// operator's approval must not fail on the agent's words. It used to be
// refused invalid_argument "reason is longer than 1024 bytes" — the
// operator's own reason was two bytes — because the termination's reason
// is the agent's with the proposal's label in front. The approval starts
// the termination; its reason (and its record's) is the label and the
// agent's words cut to the bound on a character boundary, and the proposal
// keeps them whole.
func TestSeedAnAgentsLongProposalDoesNotBlockItsApproval(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	reason := strings.Repeat("a", 1024-3*6) + strings.Repeat("é", 9) // 1,024 bytes
	prop, err := w.cAgent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Reason: reason, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
	if err != nil {
		t.Fatal(err)
	}
	decided, err := w.admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.Msg.Proposal.ProposalId, Approve: true, Reason: "ok"}))
	if err != nil {
		t.Fatalf("the operator's approval: %v", err)
	}
	term := decided.Msg.Termination
	label := "stop proposal " + prop.Msg.Proposal.ProposalId + ": "
	if !strings.HasPrefix(term.Reason, label) || len(term.Reason) > 1024 || !utf8.ValidString(term.Reason) || !strings.HasPrefix(reason, strings.TrimPrefix(term.Reason, label)) {
		t.Fatalf("termination reason %q (%d bytes), want the label and the agent's words cut to 1024 bytes", term.Reason, len(term.Reason))
	}
	if decided.Msg.Proposal.Reason != reason {
		t.Fatalf("the proposal's reason is %d bytes, want the agent's 1024 kept whole", len(decided.Msg.Proposal.Reason))
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(time.Hour)
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if rec.Reason != term.Reason || final.NodeId != w.c.Node.NodeId || len(rec.Nodes) != 1 {
		t.Fatalf("record of %s: reason %q, %d nodes, want the termination's reason and the child alone", final.NodeId, rec.Reason, len(rec.Nodes))
	}
}
