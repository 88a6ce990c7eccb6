package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
)

type revokeNothing struct{}

func (revokeNothing) RevokePrivilege(context.Context, privilege.Privilege) error { return nil }

// TestARogueThatWritesTerminalControlsCannotRewriteTheOperatorsView: the
// agents being stopped write the free text the operator reads in their
// terminal — a stop proposal's reason, a termination's reason, a
// privilege's external id, a job's completion detail — and fill it with
// terminal controls: a carriage return and escape sequences that move the
// cursor up and erase the line (so "UNACCOUNTED" could be overwritten by a
// forged "confirmed"), a line break followed by a forged line, a
// right-to-left override. `tether proposal ls`, `tether record show` and
// `tether lease show` print each of them escaped: no control character of
// the agents' reaches the terminal, no line is forged.
func TestARogueThatWritesTerminalControlsCannotRewriteTheOperatorsView(t *testing.T) {
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.PrivilegeHandlers = map[string]privilege.PrivilegeRevoker{"db-role": revokeNothing{}}
	})
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	admin, parent, child, rogue := w.admin, w.parent, w.child, w.rogue
	const forged = "\n  confirmed    worker           n_forged by control-plane"
	hostile := "fine\r\x1b[1A\x1b[2K\x1b]0;owned\x07\u202eenil" + forged
	if _, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: hostile})); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: child.Node.NodeId, Kind: "db-role", ExternalId: hostile, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour)),
	})); err != nil {
		t.Fatal(err)
	}
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: child.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	if _, err := rogue.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, Detail: hostile})); err != nil {
		t.Fatal(err)
	}
	term, err := parent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0), Reason: hostile,
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, time.Minute, "the termination's record", func() bool {
		_, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.Msg.Termination.TerminationId}))
		return err == nil
	})
	for _, args := range [][]string{{"proposal", "ls"}, {"record", "show", term.Msg.Termination.TerminationId}, {"lease", "show", "job-1"}} {
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		if !strings.Contains(out, "fine") {
			t.Fatalf("tether %s does not show the agent's text at all:\n%s", strings.Join(args, " "), out)
		}
		if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || r == '\u202e') }); i >= 0 {
			t.Fatalf("tether %s prints the agent's control character %q to the terminal:\n%q", strings.Join(args, " "), out[i:min(i+8, len(out))], out)
		}
		if strings.Contains(out, "\n  confirmed    worker") {
			t.Fatalf("tether %s prints the agent's forged line:\n%s", strings.Join(args, " "), out)
		}
	}
}
