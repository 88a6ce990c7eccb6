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

// rogue47dJob is a job id a rogue chooses: the lease module takes any
// character but a control one, so a right-to-left override, a zero-width
// space, a line separator and a tag character stand in it.
const rogue47dJob = "job-1\u202e1-boj\u200b\u2028\U000e0041"

// TestRogue47DRolloutReasonCarriesNoTerminalControl: a completed
// rollout's reason names the leases it did not hand over by their job
// ids ("1 leases were not handed over by the rollout (<job id>:
// cancellation was requested…)"), and a job id is its offerer's text. A
// rogue parent offers its v1 child a job under such an id and drains the
// child for a day (which requests the job's cancellation, so the rollout
// leaves it to be resolved); the operator's rollout takes the child over
// and completes. `tether rollout status` and `tether rollout status
// --watch` printed the reason as it is: the override, the zero-width
// space, the line separator reached the operator's terminal, where every
// other agent's text is written out (printable), and the rogue's job read
// as another. Each now prints it escaped, as the table prints a job id.
func TestRogue47DRolloutReasonCarriesNoTerminalControl(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "parent", Labels: map[string]string{"app": "orch"}}))
	if err != nil {
		t.Fatal(err)
	}
	rogue := srv.Clients(root.Msg.Credential)
	child, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "child", Labels: map[string]string{"version": "v1"}}))
	if err != nil {
		t.Fatal(err)
	}
	offered, err := rogue.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: rogue47dJob, HolderIdentity: child.Msg.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	if _, err := srv.Clients(child.Msg.Credential).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	day := durationpb.New(24 * time.Hour)
	shield, err := rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.Msg.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: day, CancelAckTimeout: day, ConfirmTimeout: day,
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's drain to mark its child", func() bool {
		got, err := admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: shield.Msg.Termination.TerminationId}))
		return err == nil && got.Msg.Termination.State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED
	})

	started, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	id := started.Msg.Rollout.RolloutId
	rollout := func() *tetherv1.Rollout {
		got, err := admin.Supervisor.GetRollout(ctx, connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Rollout
	}
	testserver.WaitFor(t, 20*time.Second, "the rollout's batch to finish its termination", func() bool {
		clk.Advance(2 * time.Second)
		r := rollout()
		return len(r.Batches) == 1 && r.Batches[0].TerminatedAt != nil
	})
	v2, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "v2", Labels: map[string]string{"version": "v2"}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: v2.Msg.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rollout to complete", func() bool {
		return rollout().State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
	})
	if r := rollout(); !strings.Contains(r.Reason, rogue47dJob) {
		t.Fatalf("the completed rollout's reason %q does not name the rogue's job", r.Reason)
	}

	for _, args := range [][]string{{"rollout", "status", id}, {"rollout", "status", id, "--watch"}} {
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		if i := terminalActing(out); i >= 0 {
			t.Errorf("tether %s writes the rogue's %q to the terminal as it is:\n%q", strings.Join(args, " "), []rune(out[i:])[0], out)
		}
		if want := printable(rogue47dJob); !strings.Contains(out, want) {
			t.Errorf("tether %s does not name the rogue's job as %s:\n%s", strings.Join(args, " "), want, out)
		}
	}
}
