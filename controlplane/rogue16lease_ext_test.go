package controlplane_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixteenth hostile pass on job leases (seed 000 §7, §9, §12), played
// by a rogue caller of a fenced tool server (agentsdk.Fence with
// IssuedGenerations). The fence asks the coordinator about every side
// effect it does not refuse on its own, and each ask was charged to the
// tool server's budget for the job the side effect named: a rogue that
// kept naming another agent's job — with a generation nobody was issued,
// or with the job's generation before its holder accepted it (the fence's
// own refusal tells the generation) — spent that job's reads, and the real
// holder's side effects at that tool were refused (503) until the budget
// refilled. Now a read is charged to the job's reads only when it admits
// the generation the fence named; every other read goes to the tool
// server's refusals. Budgets are 16 requests, never refilled (the manual
// clock does not move).
func TestRogue16ARogueNamingAnotherAgentsJobAtAFenceDoesNotFreezeItsHolder(t *testing.T) {
	srv := budgetServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	honest := register(t, admin, "honest")
	honestC := srv.Clients(honest.Credential)
	offer := func(job string) *tetherv1.Lease {
		t.Helper()
		resp, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: honest.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)}))
		if err != nil {
			t.Fatalf("offer %s: %v", job, err)
		}
		return resp.Msg.Lease
	}
	fenceAt := func(tool string) *agentsdk.Fence {
		return &agentsdk.Fence{Check: agentsdk.IssuedGenerations(agentsdk.Dial(srv.URL, srv.ToolServerToken(t, tool), agentsdk.WithHTTPClient(srv.HTTP)))}
	}
	// flood sends the rogue's side effects until the fence answers that
	// the coordinator refused to be asked, and returns that answer.
	flood := func(what string, admit func() error, want error) error {
		t.Helper()
		for i := range 64 {
			err := admit()
			if connect.CodeOf(err) == connect.CodeResourceExhausted {
				return err
			}
			if !errors.Is(err, want) {
				t.Fatalf("%s %d: %v, want %v until the asks are refused", what, i, err, want)
			}
		}
		t.Fatalf("%s were never refused; the probe tests nothing", what)
		return nil
	}

	t.Run("unissued generations", func(t *testing.T) {
		l := offer("frozen-job")
		_, d := unary{honestC}.send(t, ack(l))
		wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		fence := fenceAt("fenced-tool-unissued")
		if err := fence.AdmitContext(ctx, "frozen-job", l.LeaseGeneration); err != nil {
			t.Fatalf("the holder's first side effect: %v", err)
		}
		err := flood("the rogue's side effects under an unissued generation", func() error {
			return fence.AdmitContext(ctx, "frozen-job", l.LeaseGeneration+1)
		}, agentsdk.ErrUnissuedGeneration)
		for i := range 3 {
			if err := fence.AdmitContext(ctx, "frozen-job", l.LeaseGeneration); err != nil {
				t.Fatalf("the holder's side effect %d after the rogue's flood: %v", i, err)
			}
		}
		if !strings.Contains(err.Error(), "requests refused") {
			t.Fatalf("the rogue's asks were refused with %v, want the tool server's refusals named", err)
		}
	})

	t.Run("the generation before its holder accepts", func(t *testing.T) {
		l := offer("offered-job")
		fence := fenceAt("fenced-tool-offered")
		flood("the rogue's side effects under the offered generation", func() error {
			return fence.AdmitContext(ctx, "offered-job", l.LeaseGeneration)
		}, agentsdk.ErrNoAuthority)
		_, d := unary{honestC}.send(t, ack(l))
		wantDecision(t, "the holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		if err := fence.AdmitContext(ctx, "offered-job", l.LeaseGeneration); err != nil {
			t.Fatalf("the holder's first side effect after the rogue's flood: %v", err)
		}
	})
}
