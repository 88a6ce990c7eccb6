package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// etcdServeArgs starts an etcd for the test and returns the flags that put
// `tether serve` on it.
func etcdServeArgs(t *testing.T) []string {
	t.Helper()
	cluster := etcdtest.Start(t)
	return []string{"--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","), "--etcd-prefix", etcdtest.Prefix(t)}
}

// TestRogue25StopRulesAndTheirProposalsSurviveKill9OnBothStores: the real
// binary, on Badger and on etcd, killed with SIGKILL and started again on
// the same data. Every kind of rule (an operator's on the node, an
// operator's by selector, an agent's on its child) is still in effect, the
// agent's counters are still what it reported (it cannot start from zero by
// waiting for a restart), the pending proposal is the same one and still
// decidable, a rule that fired before the kill files nothing more, and the
// rules that were not yet true fire exactly once on the report that makes
// them true. (TestKill9KeepsWhatRulesCountedAndWhatTheOperatorAcknowledged
// and TestStopRuleKill9BetweenFiringAndProposing run on Badger only; the
// in-process restarts of the controlplane suite on etcd do not kill.)
func TestRogue25StopRulesAndTheirProposalsSurviveKill9OnBothStores(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	for _, backend := range []string{"badger", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			var args []string
			if backend == "etcd" {
				args = etcdServeArgs(t)
			}
			ctx := context.Background()
			dir, addr := t.TempDir(), testserver.FreeAddr(t)
			proc := testserver.StartProcessOn(t, dir, addr, args...)
			admin := proc.Clients(proc.Admin)
			planner, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner", Labels: map[string]string{"team": "research"}}))
			if err != nil {
				t.Fatal(err)
			}
			worker, err := proc.Clients(planner.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: planner.Msg.Node.NodeId, Name: "worker"}))
			if err != nil {
				t.Fatal(err)
			}
			workerID := worker.Msg.Node.NodeId
			add := func(c *testserver.Clients, req *tetherv1.AddStopRuleRequest) string {
				t.Helper()
				resp, err := c.StopRule.AddStopRule(ctx, connect.NewRequest(req))
				if err != nil {
					t.Fatalf("add %s: %v", req.Name, err)
				}
				return resp.Msg.Rule.RuleId
			}
			steps := add(admin, &tetherv1.AddStopRuleRequest{NodeId: workerID, Name: "steps", Expression: `self_reported.?steps.orValue(0.0) >= 3.0`})
			cost := add(admin, &tetherv1.AddStopRuleRequest{LabelSelector: "team=research", Name: "cost", Expression: `self_reported.?cost.orValue(0.0) > 10.0`})
			spawned := add(proc.Clients(planner.Msg.Credential), &tetherv1.AddStopRuleRequest{NodeId: workerID, Name: "no-children", Expression: `observed.spawns >= 1`})
			report := func(p *testserver.Process, counters map[string]float64) {
				t.Helper()
				if _, err := p.Clients(worker.Msg.Credential).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{Counters: counters})); err != nil {
					t.Fatal(err)
				}
			}
			report(proc, map[string]float64{"steps": 2, "cost": 5})
			if _, err := proc.Clients(worker.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: workerID, Name: "grandchild"})); err != nil {
				t.Fatal(err)
			}
			filed := func(p *testserver.Process) map[string][]*tetherv1.StopProposal {
				t.Helper()
				resp, err := p.Clients(p.Admin).Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
				if err != nil {
					t.Fatal(err)
				}
				out := map[string][]*tetherv1.StopProposal{}
				for _, pr := range resp.Msg.Proposals {
					if pr.NodeId == workerID {
						out[pr.Rule.GetRuleId()] = append(out[pr.Rule.GetRuleId()], pr)
					}
				}
				return out
			}
			var pending *tetherv1.StopProposal
			testserver.WaitFor(t, 30*time.Second, "the planner's rule on its worker to file", func() bool {
				if got := filed(proc)[spawned]; len(got) == 1 {
					pending = got[0]
				}
				return pending != nil
			})
			if got := filed(proc); len(got[steps]) != 0 || len(got[cost]) != 0 {
				t.Fatalf("rules filed before they were true: %v", got)
			}
			proc.Kill()

			proc = testserver.StartProcessOn(t, dir, addr, args...)
			admin = proc.Clients(proc.Admin)
			listed, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: workerID}))
			if err != nil {
				t.Fatal(err)
			}
			inEffect := map[string]bool{}
			for _, r := range listed.Msg.Rules {
				inEffect[r.RuleId] = true
			}
			if !inEffect[steps] || !inEffect[cost] || !inEffect[spawned] || len(listed.Msg.Rules) != 3 {
				t.Fatalf("rules in effect at the worker after kill -9: %v", listed.Msg.Rules)
			}
			tested, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: workerID, RuleId: steps}))
			if err != nil {
				t.Fatal(err)
			}
			if tested.Msg.SelfReported["steps"] != 2 || tested.Msg.SelfReported["cost"] != 5 {
				t.Fatalf("the worker's counters after kill -9: %v, want steps 2 and cost 5", tested.Msg.SelfReported)
			}
			// One more step, and the cost past its cap: each of the two rules
			// files once; the one that fired before the kill files nothing more.
			report(proc, map[string]float64{"steps": 3})
			report(proc, map[string]float64{"cost": 11})
			var got map[string][]*tetherv1.StopProposal
			testserver.WaitFor(t, 30*time.Second, "the steps and cost rules to file after kill -9", func() bool {
				got = filed(proc)
				return len(got[steps]) > 0 && len(got[cost]) > 0
			})
			// Judge the worker once more with both rules still true: the
			// planner's rule added now fires on the same report, and the
			// evaluator judges a node's agents' rules after its operators'
			// (in the same evaluation or the phase after), so once it has
			// filed, an operator's rule filing twice would have done so.
			marker := add(proc.Clients(planner.Msg.Credential), &tetherv1.AddStopRuleRequest{NodeId: workerID, Name: "marker", Expression: `self_reported.?marker.orValue(0.0) >= 1.0`})
			report(proc, map[string]float64{"steps": 4, "cost": 12, "marker": 1})
			testserver.WaitFor(t, 30*time.Second, "the marker rule to file", func() bool {
				got = filed(proc)
				return len(got[marker]) > 0
			})
			if len(got[steps]) != 1 || len(got[cost]) != 1 || len(got[spawned]) != 1 {
				t.Fatalf("after kill -9: %d steps, %d cost and %d no-children proposals, want one each", len(got[steps]), len(got[cost]), len(got[spawned]))
			}
			if p := got[spawned][0]; p.ProposalId != pending.ProposalId || p.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
				t.Fatalf("the pending proposal after kill -9: %v, want %s pending", p, pending.ProposalId)
			}
			if v := got[cost][0].Rule.GetValues(); len(v) != 1 || v[0].Value != "11" || !v[0].SelfReported {
				t.Fatalf("the cost rule's values: %v", v)
			}
			decided, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: pending.ProposalId, Approve: true, Reason: "probe"}))
			if err != nil {
				t.Fatalf("approve the proposal filed before kill -9: %v", err)
			}
			if decided.Msg.Termination.GetTerminationId() == "" {
				t.Fatalf("approving %s started no termination: %v", pending.ProposalId, decided.Msg)
			}
		})
	}
}

// TestRogue25ARolloutSurvivesKill9OnBothStores: the real binary, on Badger
// and on etcd, killed with SIGKILL once each batch has started, and started
// again on the same data. The rollout resumes where it was: each batch
// keeps its termination, each writes one record, and each drained agent's
// job is handed over once (generation 2) to the replacement. (The
// controlplane suite restarts a rollout in process, on both stores; this
// kills the process.)
func TestRogue25ARolloutSurvivesKill9OnBothStores(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	for _, backend := range []string{"badger", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			var args []string
			if backend == "etcd" {
				args = etcdServeArgs(t)
			}
			ctx := context.Background()
			dir, addr := t.TempDir(), testserver.FreeAddr(t)
			proc := testserver.StartProcessOn(t, dir, addr, args...)
			admin := proc.Clients(proc.Admin)
			register := func(name, version string) string {
				t.Helper()
				resp, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name, Labels: map[string]string{"app": "swarm", "version": version}}))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Msg.Node.NodeId
			}
			jobOf := map[string]string{}
			for _, name := range []string{"a0", "a1"} {
				node := register(name, "v1")
				jobOf[node] = "job-" + name
				if _, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-" + name, HolderIdentity: node, LeaseDuration: durationpb.New(10 * time.Minute)})); err != nil {
					t.Fatal(err)
				}
			}
			started, err := admin.Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{Selector: "app=swarm,version=v1", TargetSelector: "version=v2", Batch: 1,
				DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Minute)}))
			if err != nil {
				t.Fatal(err)
			}
			id := started.Msg.Rollout.RolloutId
			get := func() *tetherv1.Rollout {
				t.Helper()
				resp, err := admin.Supervisor.GetRollout(ctx, connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: id}))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Msg.Rollout
			}
			var terminations []string
			for b := range 2 {
				var r *tetherv1.Rollout
				testserver.WaitFor(t, 30*time.Second, fmt.Sprintf("batch %d to start", b), func() bool {
					r = get()
					return len(r.Batches) > b
				})
				terminations = append(terminations, r.Batches[b].TerminationId)
				proc.Kill()
				proc = testserver.StartProcessOn(t, dir, addr, args...)
				admin = proc.Clients(proc.Admin)
				r = get()
				if len(r.Batches) != b+1 || r.Batches[b].TerminationId != terminations[b] {
					t.Fatalf("after kill -9 the rollout has %d batches, batch %d's termination %s (was %s)", len(r.Batches), b, r.Batches[len(r.Batches)-1].TerminationId, terminations[b])
				}
				for _, n := range r.Batches[b].NodeIds {
					if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: n})); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := admin.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: register(fmt.Sprintf("b%d", b), "v2")})); err != nil {
					t.Fatal(err)
				}
			}
			var r *tetherv1.Rollout
			testserver.WaitFor(t, 60*time.Second, "the rollout to complete", func() bool {
				r = get()
				return r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED
			})
			if len(r.Batches) != 2 || r.Counts.LeasesHandedOver != 2 {
				t.Fatalf("completed with %d batches and %d leases handed over, want 2 and 2: %v", len(r.Batches), r.Counts.LeasesHandedOver, r)
			}
			for node, job := range jobOf {
				l, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
				if err != nil {
					t.Fatal(err)
				}
				if l.Msg.Lease.HolderIdentity == node || l.Msg.Lease.LeaseGeneration != 2 {
					t.Fatalf("%s after the rollout: held by %s generation %d, want a replacement's, generation 2 (handed over once)", job, l.Msg.Lease.HolderIdentity, l.Msg.Lease.LeaseGeneration)
				}
			}
			recs, err := admin.Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			perTermination := map[string]int{}
			for _, rec := range recs.Msg.Records {
				perTermination[rec.TerminationId]++
			}
			if len(perTermination) != 2 || perTermination[terminations[0]] != 1 || perTermination[terminations[1]] != 1 {
				t.Fatalf("records per termination %v, want one for each of %v", perTermination, terminations)
			}
		})
	}
}
