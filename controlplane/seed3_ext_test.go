package controlplane_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The third acceptance pass over seed 003 (termination), through the real
// server: what the record must say about *when* and *on whose word*, what
// late and duplicate words change, and what the workload can still do to
// the subtree being stopped from outside it — the promises the first two
// passes (seed_term_ext_test.go, seed2_ext_test.go) and the rogue passes
// left out.

// publishedRecord waits for the record sink's file of rec and returns it
// decoded as JSON, after checking it against docs/record.schema.json
// (wantPublishedRecord): what a post-mortem reads.
func publishedRecord(t *testing.T, srv *testserver.Server, rec *tetherv1.ReconciliationRecord) map[string]any {
	t.Helper()
	dir := filepath.Join(srv.DataDir, "records")
	wantPublishedRecord(t, dir, rec)
	raw, err := os.ReadFile(filepath.Join(dir, rec.RecordId+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// entries is a published record's list under key, each entry by its id
// field.
func entries(doc map[string]any, key, idField string) map[string]map[string]any {
	out := map[string]map[string]any{}
	list, _ := doc[key].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		id, _ := m[idField].(string)
		out[id] = m
	}
	return out
}

// wantAt checks that a published entry's timestamp field is at, or absent
// when at is zero.
func wantAt(t *testing.T, what string, entry map[string]any, field string, at time.Time) {
	t.Helper()
	got, present := entry[field].(string)
	if at.IsZero() {
		if present {
			t.Errorf("%s: %s is %s, want none", what, field, got)
		}
		return
	}
	if !present {
		t.Errorf("%s: the record does not say %s (want %s): %v", what, field, at.UTC().Format(time.RFC3339Nano), entry)
		return
	}
	if ts, err := time.Parse(time.RFC3339Nano, got); err != nil || !ts.Equal(at) {
		t.Errorf("%s: %s is %s, want %s", what, field, got, at.UTC().Format(time.RFC3339Nano))
	}
}

// Seed 003 (draining, aborting, the record): the drain lets the calls in
// flight finish inside a bounded window, then the abort cancels what is
// left and waits for the tool layer's acknowledgements; the record, written
// from outside, says which calls were in flight and how each was resolved.
// A post-mortem must be able to tell a call that finished inside the drain
// window from one the gate reported completed only after the escalation
// ordered its cancel (the tool ran past its window and its side effect
// landed during the abort), and an acknowledgement inside the timeout from
// a call the termination closed at its deadline: the record must say when
// each call began, when its cancel was ordered, and when and on whose word
// it ended, and the gate's error of a failed one. A rogue's gate that holds
// its call open past the window and then reports it completed reads, in a
// record with resolutions alone, exactly like a call that finished in time.
func TestSeed3TheRecordSaysWhenEachCallWasOrderedAndEnded(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	t0 := w.clk.Now()
	var calls []string
	for range 5 {
		id, err := w.begin(w.gC.token)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, id)
	}
	inWindow, failedInWindow, pastWindow, acked, held := calls[0], calls[1], calls[2], calls[3], calls[4]
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 10*time.Second, 10*time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	w.clk.Advance(2 * time.Second)
	refusedAt := w.clk.Now()
	_, err := w.begin(w.gC.token)
	wantRefused(t, "a new call while draining", err, connect.CodeFailedPrecondition, "draining")
	w.clk.Advance(2 * time.Second)
	endedInWindow := w.clk.Now()
	end := func(call string, failed bool, msg string) {
		t.Helper()
		if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1", Failed: failed, Error: msg})); err != nil {
			t.Fatal(err)
		}
	}
	end(inWindow, false, "")
	end(failedInWindow, true, "upstream 502")
	// The window runs out: the escalation orders the cancel of the three
	// calls left.
	w.clk.Advance(6 * time.Second)
	ordered := w.clk.Now()
	testserver.WaitFor(t, 20*time.Second, "the escalation's three cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 3
	})
	w.clk.Advance(2 * time.Second)
	endedPast := w.clk.Now()
	end(pastWindow, false, "")
	w.clk.Advance(time.Second)
	ackedAt := w.clk.Now()
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: acked, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	// The acknowledgement timeout runs out for the call the gate holds.
	w.clk.Advance(7 * time.Second)
	deadline := w.clk.Now()
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	for _, id := range []string{w.c.Node.NodeId, w.p.Node.NodeId} {
		if _, err := w.admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "launcher: process gone"})); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	doc := publishedRecord(t, w.srv, rec)
	got := entries(doc, "toolCalls", "callId")
	if len(got) != 6 {
		t.Fatalf("the record lists %d calls, want the five in flight and the refused one: %v", len(got), doc["toolCalls"])
	}
	var refused string
	for id, c := range got {
		if c["resolution"] == "CALL_RESOLUTION_REJECTED_DRAINING" {
			refused = id
		}
	}
	type want struct {
		resolution                        string
		begun, ordered, ended, acked      time.Time
		endedBy, acknowledgedBy, errorMsg string
	}
	gate, closedBy := "tool:gate-1", "termination:"+term.TerminationId
	for id, wc := range map[string]want{
		inWindow:       {"CALL_RESOLUTION_COMPLETED", t0, time.Time{}, endedInWindow, time.Time{}, gate, "", ""},
		failedInWindow: {"CALL_RESOLUTION_FAILED", t0, time.Time{}, endedInWindow, time.Time{}, gate, "", "upstream 502"},
		pastWindow:     {"CALL_RESOLUTION_COMPLETED", t0, ordered, endedPast, time.Time{}, gate, "", ""},
		acked:          {"CALL_RESOLUTION_CANCELLED_ACKED", t0, ordered, ackedAt, ackedAt, gate, gate, ""},
		held:           {"CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED", t0, ordered, deadline, time.Time{}, closedBy, "", ""},
		refused:        {"CALL_RESOLUTION_REJECTED_DRAINING", refusedAt, time.Time{}, refusedAt, time.Time{}, "", "", ""},
	} {
		c := got[id]
		if c == nil {
			t.Errorf("call %s is not in the record", id)
			continue
		}
		if c["resolution"] != wc.resolution {
			t.Errorf("call %s: %v, want %s", id, c["resolution"], wc.resolution)
		}
		wantAt(t, "call "+id+" ("+wc.resolution+")", c, "begunAt", wc.begun)
		wantAt(t, "call "+id+" ("+wc.resolution+")", c, "cancelRequestedAt", wc.ordered)
		wantAt(t, "call "+id+" ("+wc.resolution+")", c, "endedAt", wc.ended)
		wantAt(t, "call "+id+" ("+wc.resolution+")", c, "acknowledgedAt", wc.acked)
		if by, _ := c["endedBy"].(string); by != wc.endedBy && wc.endedBy != "" {
			t.Errorf("call %s: ended by %q, want %q", id, by, wc.endedBy)
		}
		if by, _ := c["acknowledgedBy"].(string); by != wc.acknowledgedBy {
			t.Errorf("call %s: acknowledged by %q, want %q", id, by, wc.acknowledgedBy)
		}
		if msg, _ := c["error"].(string); msg != wc.errorMsg {
			t.Errorf("call %s: error %q, want %q", id, msg, wc.errorMsg)
		}
	}
	// The record's own phases place the ends: the call that ran past the
	// window ended after draining did.
	phases := map[string]time.Time{}
	for _, p := range rec.Phases {
		phases[p.Name] = p.StartedAt.AsTime()
	}
	if a := phases["aborting"]; !a.Equal(ordered) || !endedPast.After(a) || !endedInWindow.Before(a) {
		t.Errorf("aborting started at %s; want it at the cancel order %s, between the in-window end %s and the late one %s", a, ordered, endedInWindow, endedPast)
	}
}

// Seed 003 (the record): which privileges were revoked and which expired —
// and, for a post-mortem, when, on whose word, and whose word their
// expiry was. An agent registers a file lock that "expires" in a second
// (its own word: the lock it really holds may live on), its operator a
// queue reservation for an hour with a revoke hook; the agent's root grant
// and its child's delegated grant, the child's lapsing first. An operator
// aborts the agent. The record says, for every privilege, when it was
// decided (revoked or expired), the expiry that was declared, who
// registered or issued it, and for a revoked one who revoked it: the
// expired lock is visibly the agent's own declaration.
func TestSeed3TheRecordSaysWhenAndOnWhoseWordEachPrivilegeEnded(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusNoContent) }))
	defer hook.Close()
	t0 := w.clk.Now()
	c2 := spawn(t, w.pAgent, w.p.Node.NodeId, "child-2")
	gC2 := delegateFor(t, w.pAgent, w.gP, c2.Node.NodeId, time.Minute, "tool:shell")
	lock, err := w.pAgent.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.p.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/p", ExpiresAt: timestamppb.New(t0.Add(time.Second)), RevokeUrl: hook.URL,
	}))
	if err != nil {
		t.Fatal(err)
	}
	queue, err := w.admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.p.Node.NodeId, Kind: "queue_reservation", ExternalId: "jobs/42", ExpiresAt: timestamppb.New(t0.Add(time.Hour)), RevokeUrl: hook.URL,
	}))
	if err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(2 * time.Minute)
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	revokedAt := w.clk.Now()
	// The webhook answers on the real network: its revocation is decided
	// (as of the manual clock's now) before the clock moves past its
	// deadline, or the record would rightly say it never answered.
	testserver.WaitFor(t, 20*time.Second, "the queue reservation's webhook to be answered", func() bool {
		privs, err := w.admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: w.p.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range privs.Msg.Privileges {
			if p.PrivilegeId == queue.Msg.PrivilegeId {
				return p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_UNSPECIFIED
			}
		}
		return false
	})
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	doc := publishedRecord(t, w.srv, rec)
	got := entries(doc, "privileges", "privilegeId")
	operator := rec.RequestedBy
	type want struct {
		outcome                 string
		decided, expires        time.Time
		registeredBy, revokedBy string
	}
	for id, wp := range map[string]want{
		lock.Msg.PrivilegeId:  {"PRIVILEGE_OUTCOME_EXPIRED", t0.Add(time.Second), t0.Add(time.Second), "agent:" + w.p.Node.NodeId, ""},
		queue.Msg.PrivilegeId: {"PRIVILEGE_OUTCOME_REVOKED", revokedAt, t0.Add(time.Hour), operator, "webhook"},
		w.gP.grant.GrantId:    {"PRIVILEGE_OUTCOME_REVOKED", revokedAt, w.gP.grant.ExpiresAt.AsTime(), w.gP.grant.Issuer, "termination:" + term.TerminationId},
		w.gC.grant.GrantId:    {"PRIVILEGE_OUTCOME_REVOKED", revokedAt, w.gC.grant.ExpiresAt.AsTime(), w.gC.grant.Issuer, "termination:" + term.TerminationId},
		gC2.grant.GrantId:     {"PRIVILEGE_OUTCOME_EXPIRED", gC2.grant.ExpiresAt.AsTime(), gC2.grant.ExpiresAt.AsTime(), gC2.grant.Issuer, ""},
	} {
		p := got[id]
		if p == nil {
			t.Errorf("privilege %s is not in the record", id)
			continue
		}
		what := "privilege " + id + " (" + wp.outcome + ")"
		if p["outcome"] != wp.outcome {
			t.Errorf("%s: %v", what, p["outcome"])
		}
		wantAt(t, what, p, "decidedAt", wp.decided)
		wantAt(t, what, p, "expiresAt", wp.expires)
		if by, _ := p["registeredBy"].(string); by != wp.registeredBy {
			t.Errorf("%s: registered by %q, want %q", what, by, wp.registeredBy)
		}
		if by, _ := p["revokedBy"].(string); by != wp.revokedBy {
			t.Errorf("%s: revoked by %q, want %q", what, by, wp.revokedBy)
		}
	}
	if len(got) != 5 {
		t.Errorf("the record lists %d privileges, want 5", len(got))
	}
}

// Seed 003 (the single-process assumption, draining): a node being drained
// gets no new credentials, from anyone. The rogue's parent P is drained by
// an operator while its child C has a call open; the grandparent G — an
// agent outside the stopped subtree, still running — and an operator try
// to arm C for after the drain: G delegates a fresh grant to C and
// registers a privilege for it, an operator issues C a root grant and
// registers a privilege for it. Each is refused (failed_precondition
// naming the state; G's privilege permission_denied, an agent registers
// only its own) and nothing is stored (held).
func TestSeed3NoOneArmsANodeBeingDrained(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	g := register(t, w.admin, "grandparent")
	gAgent := w.srv.Clients(g.Credential)
	p := spawn(t, gAgent, g.Node.NodeId, "parent")
	pAgent := w.srv.Clients(p.Credential)
	c := spawn(t, pAgent, p.Node.NodeId, "child")
	gG := issueRoot(t, w.admin, g.Node.NodeId, time.Hour, "tool:*")
	gP := delegate(t, gAgent, gG, p.Node.NodeId, "tool:*")
	gC := delegate(t, pAgent, gP, c.Node.NodeId, "tool:shell")
	if _, err := w.begin(gC.token); err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	before := len(allGrants(t, w.admin, &tetherv1.ListGrantsRequest{}))

	_, err := gAgent.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gG.grant.GrantId, HolderNodeId: c.Node.NodeId, Scopes: []string{"tool:*"}}))
	wantRefused(t, "the grandparent's delegation to the draining child", err, connect.CodeFailedPrecondition, "draining")
	_, err = w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: c.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	wantRefused(t, "an operator's root grant to the draining child", err, connect.CodeFailedPrecondition, "draining")
	late := &tetherv1.RegisterPrivilegeRequest{
		NodeId: c.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/late", ExpiresAt: timestamppb.New(w.clk.Now().Add(time.Hour)), RevokeUrl: "http://127.0.0.1:1/revoke",
	}
	_, err = gAgent.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(late))
	wantRefused(t, "the grandparent's privilege for the draining child", err, connect.CodePermissionDenied, "its own node")
	_, err = w.admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(late))
	wantRefused(t, "an operator's privilege for the draining child", err, connect.CodeFailedPrecondition, "draining")
	if after := len(allGrants(t, w.admin, &tetherv1.ListGrantsRequest{})); after != before {
		t.Errorf("%d grants after the refusals, %d before", after, before)
	}
	privs, err := w.admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: c.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(privs.Msg.Privileges) != 0 {
		t.Errorf("the draining child holds privileges %v", privs.Msg.Privileges)
	}
}

// Seed 003 (the order of the steps): aborting cancels the calls in flight
// and waits for the tool layer's acknowledgements; only then does
// reconciling revoke and write the record, and only then is terminated
// reached. The record's own times must show that order, so a reader can
// check it: the phases follow each other without a gap; every call was
// settled by the time reconciling began — the one the gate never
// acknowledged closed at the instant the termination stopped waiting for
// it (its acknowledgement deadline), not whenever the record came to be
// written — and every privilege was revoked after that and before the
// record was written. Here nobody confirms an exit, so the record is
// written a minute after the deadline, at the confirm timeout, by a server
// restarted meanwhile: the late gate's refusal names the deadline too.
func TestSeed3TheRecordsTimesFollowTheSeedsOrder(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusNoContent) }))
	defer hook.Close()
	if _, err := w.admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.c.Node.NodeId, Kind: "file_lock", ExternalId: "/locks/c", ExpiresAt: timestamppb.New(w.clk.Now().Add(time.Hour)), RevokeUrl: hook.URL,
	})); err != nil {
		t.Fatal(err)
	}
	acked, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	held, err := w.begin(w.gC.token)
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 10*time.Second, time.Minute)
	requested := w.clk.Now()
	testserver.WaitFor(t, 20*time.Second, "the abort's two cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 2
	})
	w.clk.Advance(time.Second)
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: acked, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(9 * time.Second)
	deadline := w.clk.Now()
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	// The server stops while the record waits for confirmations, and the
	// clock moves while it is down: the restarted reconciler dates the
	// gate's silence where the termination stopped listening, as the
	// first would have.
	w.srv.Stop()
	w.clk.Advance(30 * time.Second)
	w.srv = testserver.StartIn(t, w.srv.DataDir, testserver.WithClock(w.clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	w.admin, w.gate = w.srv.AdminClients(), w.srv.Clients(w.srv.ToolServerToken(t, "gate-1"))
	w.clk.Advance(31 * time.Second)
	final := waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	doc := publishedRecord(t, w.srv, rec)

	wantHeader(t, rec, final, "requested", "aborting", "reconciling")
	next := requested
	for _, p := range rec.Phases {
		if !p.StartedAt.AsTime().Equal(next) {
			t.Errorf("phase %s started at %s, want %s (where the one before ended)", p.Name, p.StartedAt.AsTime(), next)
		}
		next = p.StartedAt.AsTime().Add(p.Duration.AsDuration())
	}
	reconciling, written := rec.Phases[2].StartedAt.AsTime(), rec.WrittenAt.AsTime()
	if !reconciling.Equal(deadline) {
		t.Errorf("reconciling began at %s, want the acknowledgement deadline %s", reconciling, deadline)
	}
	if !next.Equal(written) {
		t.Errorf("the phases end at %s, the record was written at %s", next, written)
	}
	calls := entries(doc, "toolCalls", "callId")
	wantAt(t, "the acknowledged call", calls[acked], "endedAt", requested.Add(time.Second))
	wantAt(t, "the call the gate held", calls[held], "endedAt", deadline)
	for id, c := range calls {
		ended, _ := time.Parse(time.RFC3339Nano, c["endedAt"].(string))
		if ended.After(reconciling) {
			t.Errorf("call %s ended at %s, after reconciling began at %s", id, ended, reconciling)
		}
	}
	privs := entries(doc, "privileges", "privilegeId")
	if len(privs) != 3 {
		t.Errorf("the record lists %d privileges, want two grants and the lock", len(privs))
	}
	for id, p := range privs {
		decided, err := time.Parse(time.RFC3339Nano, p["decidedAt"].(string))
		if err != nil || decided.Before(reconciling) || decided.After(written) {
			t.Errorf("privilege %s revoked at %v, want between reconciling (%s) and the record (%s)", id, p["decidedAt"], reconciling, written)
		}
	}
	_, err = w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: held, GateId: "gate-1"}))
	wantRefused(t, "the gate's late acknowledgement", err, connect.CodeFailedPrecondition, deadline.UTC().Format(time.RFC3339))
}

// Seed 003 (late and duplicate words): the record is written from outside,
// once; what is said after it changes neither the record nor what the
// control plane shows of the stopped nodes. A gate's report is final once
// made: the same gate's second, contradicting report of a call it ended
// (failed after completed, an acknowledgement after an end) is answered
// with the call as first recorded, and the record keeps the first word.
// After the record, a running ancestor outside the stopped subtree — an
// agent of the same swarm — vouches for its stopped grandchild that the
// record lists unaccounted: refused failed_precondition naming the
// termination whose record stands (it used to be kept, and GetNode showed
// the node confirmed by the grandparent),
// and the node does not turn confirmed in GetNode.
func TestSeed3AWordAfterTheFactChangesNeitherTheRecordNorTheNode(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	g := register(t, w.admin, "grandparent")
	gAgent := w.srv.Clients(g.Credential)
	p := spawn(t, gAgent, g.Node.NodeId, "parent")
	pAgent := w.srv.Clients(p.Credential)
	c := spawn(t, pAgent, p.Node.NodeId, "child")
	gG := issueRoot(t, w.admin, g.Node.NodeId, time.Hour, "tool:*")
	gP := delegate(t, gAgent, gG, p.Node.NodeId, "tool:*")
	gC := delegate(t, pAgent, gP, c.Node.NodeId, "tool:shell")
	var calls []string
	for range 2 {
		id, err := w.begin(gC.token)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, id)
	}
	term := terminate(t, w.admin, p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	testserver.WaitFor(t, 20*time.Second, "the abort's cancel orders", func() bool {
		return getTermination(t, w.admin, term.TerminationId).Progress.GetAcksPending() == 2
	})
	first, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: calls[0], GateId: "gate-1"}))
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: calls[0], GateId: "gate-1", Failed: true, Error: "on second thought"}))
	if err != nil || again.Msg.Call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || !again.Msg.Call.EndedAt.AsTime().Equal(first.Msg.Call.EndedAt.AsTime()) {
		t.Errorf("the gate's contradicting end: %v, %v; want the call as first recorded, completed", again, err)
	}
	acked, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: calls[0], GateId: "gate-1"}))
	if err != nil || acked.Msg.Call.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || acked.Msg.Call.AcknowledgedBy != "" {
		t.Errorf("an acknowledgement after the end: %v, %v; want the call as first recorded, completed and unacknowledged", acked, err)
	}
	if _, err := w.gate.Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: calls[1], GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	w.clk.Advance(2 * time.Minute) // nobody confirms an exit
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	if got := callIDs(rec); got[calls[0]] != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || got[calls[1]] != tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED {
		t.Fatalf("record calls %v, want the first word on each", got)
	}
	if n := recordNode(t, rec, c.Node.NodeId); n.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("record: the child is %s, want unaccounted", n.Outcome)
	}
	beforeNode := getNode(t, w.admin, c.Node.NodeId)

	_, err = gAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: c.Node.NodeId, Reason: "it is gone, trust me"}))
	wantRefused(t, "the grandparent's word after the record", err, connect.CodeFailedPrecondition, c.Node.NodeId, "terminated", term.TerminationId)
	if after := getNode(t, w.admin, c.Node.NodeId); after.ExitConfirmedBy != beforeNode.ExitConfirmedBy || len(after.ExitConfirmations) != len(beforeNode.ExitConfirmations) {
		t.Errorf("the stopped child after the grandparent's word: confirmed by %q with %d confirmations, was %q with %d",
			after.ExitConfirmedBy, len(after.ExitConfirmations), beforeNode.ExitConfirmedBy, len(beforeNode.ExitConfirmations))
	}
	if after := record(t, w.admin, term.TerminationId); len(after.Nodes) != len(rec.Nodes) || recordNode(t, after, c.Node.NodeId).Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatal("the record changed after it was written")
	}
}

// Seed 003 (the single-process assumption): children are created at run
// time and may outlive what created them; a child holding a credential
// delegated through its gone parent works on after it. Parent P claims
// its exit and closes its session; its child C, still running, spawns a
// grandchild GC after that and delegates to it the grant P had delegated
// to C; GC calls a tool with it. The operator's drain of P — a node
// already gone — reaches the grandchild nobody registered from outside:
// GC's call is let finish in the window, its next is refused, GC's grant
// is revoked through the chain from the top (its token refused at the
// gate afterwards), and the record lists P, C and GC once each, GC
// unaccounted (nobody confirmed it) with the grant it held, the call
// completed and the refused one rejected_draining. (held)
func TestSeed3AGrandchildSpawnedAfterItsGrandparentLeftIsStillStopped(t *testing.T) {
	w := newSeedWorld(t)
	ctx := context.Background()
	sess, err := openSession(t, w.pAgent, w.p.Node.NodeId)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.pAgent.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.p.Node.NodeId, Reason: "parent done"})); err != nil {
		t.Fatal(err)
	}
	sess.close()
	gc := spawn(t, w.cAgent, w.c.Node.NodeId, "grandchild")
	gGC := delegate(t, w.cAgent, w.gC, gc.Node.NodeId, "tool:shell")
	call, err := w.begin(gGC.token)
	if err != nil {
		t.Fatalf("the grandchild's call: %v", err)
	}
	term := terminate(t, w.admin, w.p.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_DRAINING)
	_, err = w.begin(gGC.token)
	wantRefused(t, "the grandchild's next call while draining", err, connect.CodeFailedPrecondition, "draining")
	if _, err := w.gate.Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: "gate-1"})); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	_, err = w.begin(gGC.token)
	wantRefused(t, "the grandchild's call once revoked", err, connect.CodePermissionDenied, "revoked")
	w.clk.Advance(2 * time.Minute)
	waitState(t, w.srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, w.admin, term.TerminationId)
	nodes := recordNodes(t, rec)
	if len(nodes) != 3 || nodes[w.p.Node.NodeId] == nil || nodes[w.c.Node.NodeId] == nil || nodes[gc.Node.NodeId] == nil {
		t.Fatalf("record nodes %v, want P, C and GC once each", nodeOutcomes(rec))
	}
	if g := nodes[gc.Node.NodeId]; g.Outcome != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED || g.ParentNodeId != w.c.Node.NodeId || len(g.HeldGrantIds) != 1 || g.HeldGrantIds[0] != gGC.grant.GrantId {
		t.Errorf("record: the grandchild %s under %s holding %v, want unaccounted under C holding its grant", g.Outcome, g.ParentNodeId, g.HeldGrantIds)
	}
	calls := callIDs(rec)
	if calls[call] != tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || len(calls) != 2 {
		t.Errorf("record calls %v, want the grandchild's call completed and its refused one", calls)
	}
	privs := map[string]*tetherv1.RecordPrivilege{}
	for _, p := range rec.Privileges {
		privs[p.ExternalId] = p
	}
	if p := privs[gGC.grant.GrantId]; p == nil || p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || p.NodeId != gc.Node.NodeId || p.RevokedBy != "termination:"+term.TerminationId {
		t.Errorf("record: the grandchild's grant %v, want revoked by the termination on the grandchild", p)
	}
}
