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

// The seventh rogue pass: what the sixth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP, real JWTs, the
// manual clock).

// A rogue holder cannot write its job's terminal detail in an operator's
// or the control plane's words: its Complete detail is signed with its
// principal, on the unary RPC and on the Channel stream alike, as the
// coordinators' reasons are.
func TestARogueHolderCannotPassItsCompletionForTheOperators(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	forged := "operator:admin: terminated: the operator aborted the subtree"
	want := "agent:" + w.w1 + ": " + forged

	// Unary.
	job := w.job()
	l := w.offer(t, job, w.w1, time.Minute)
	l, d := unary{w.w1C}.send(t, ack(l))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	done, err := w.w1C.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, Detail: forged}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the rogue's completion", done.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if got := w.get(t, job).TerminalDetail; got != want {
		t.Fatalf("the job's terminal detail = %q, want %q", got, want)
	}
	if got := done.Msg.Lease.GetTerminalDetail(); got != want {
		t.Fatalf("the completion's answer shows the terminal detail %q, want %q", got, want)
	}

	// The Channel stream.
	job2 := w.job()
	l2 := w.offer(t, job2, w.w1, time.Minute)
	l2, d = unary{w.w1C}.send(t, ack(l2))
	wantDecision(t, "ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	stream := w.w1C.Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	m := complete(l2, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED)
	m.CorrelationId = 1
	m.GetComplete().Detail = forged
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != "" {
		t.Fatalf("channel: %s", resp.Error)
	}
	wantDecision(t, "the rogue's completion on the stream", resp.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_TERMINAL_ACCEPTED)
	if got := w.get(t, job2).TerminalDetail; got != want {
		t.Fatalf("the job's terminal detail (stream) = %q, want %q", got, want)
	}
}

// A rogue cannot learn whether another tree's termination, node or grant
// exists by asking for it by id: GetTermination, WatchTermination, GetNode
// and GetGrant answer an object it may not read exactly as one that does
// not exist (not_found, the same message but for the id). They used to
// answer permission_denied for the one and not_found for the other.
func TestARogueCannotProbeWhetherAnotherTreesObjectsExist(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rogueC := srv.Clients(rogue.Credential)
	victim := register(t, admin, "victim")
	child := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "child")
	g, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: victim.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	term := terminate(t, admin, child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)

	// same checks that the hidden object and the missing one are answered
	// alike: not_found, with the same message once each id is blanked.
	same := func(what, hiddenID, missingID string, ask func(id string) error) {
		t.Helper()
		hidden, missing := ask(hiddenID), ask(missingID)
		if connect.CodeOf(hidden) != connect.CodeNotFound || connect.CodeOf(missing) != connect.CodeNotFound {
			t.Errorf("%s: another tree's answers %v, a missing one %v; want not_found for both", what, hidden, missing)
			return
		}
		h := strings.ReplaceAll(hidden.Error(), hiddenID, "ID")
		m := strings.ReplaceAll(missing.Error(), missingID, "ID")
		if h != m {
			t.Errorf("%s: another tree's answers %q, a missing one %q; want the same", what, h, m)
		}
	}
	same("GetTermination", term.TerminationId, "t_00000000000000000000", func(id string) error {
		_, err := rogueC.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
		return err
	})
	same("WatchTermination", term.TerminationId, "t_00000000000000000000", func(id string) error {
		stream, err := rogueC.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: id}))
		if err != nil {
			return err
		}
		defer stream.Close()
		if stream.Receive() {
			return nil
		}
		return stream.Err()
	})
	same("GetNode", child.Node.NodeId, "n_00000000000000000000", func(id string) error {
		_, err := rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
		return err
	})
	same("GetGrant", g.Msg.Grant.GrantId, "g_00000000000000000000", func(id string) error {
		_, err := rogueC.Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: id}))
		return err
	})
	// Whoever may read them still does.
	if _, err := srv.Clients(victim.Credential).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.Node.NodeId})); err != nil {
		t.Errorf("the victim reading its child: %v", err)
	}
	if _, err := srv.Clients(victim.Credential).Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: g.Msg.Grant.GrantId})); err != nil {
		t.Errorf("the victim reading its grant: %v", err)
	}
	if _, err := admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.TerminationId})); err != nil {
		t.Errorf("the operator reading the termination: %v", err)
	}
}
