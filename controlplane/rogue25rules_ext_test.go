package controlplane_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// The twenty-fifth hostile pass on stop rules and rollouts: the agent a
// rule is meant to stop, and the agent being drained for an upgrade.

// TestRogue25ALeaseHoarderIsCountedWhateverItsJobIDs: the leases a rule
// reads (observed.leases_held, leases_by_state) are every lease the node
// holds, not the first thousand by job id. A rogue coordinator chooses its
// workers' job ids: with a thousand leases on ids that sort first, the
// evaluator read 1000 held for a worker holding 1010, and an operator's
// rule over a thousand never fired.
func TestRogue25ALeaseHoarderIsCountedWhateverItsJobIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("offers a thousand leases through the real server")
	}
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	worker := spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "worker")
	rule := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "lease-hoarder",
		Expression: `observed.leases_held > 1000 || observed.leases_by_state[?"offered"].orValue(0) > 1000`})

	offerMany(t, srv.Clients(rogue.Credential), worker.Node.NodeId, "a", 1010)

	ctx := context.Background()
	tested, err := admin.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: worker.Node.NodeId, RuleId: rule.RuleId}))
	if err != nil {
		t.Fatal(err)
	}
	if v := valueOf(tested.Msg.Values, "observed.leases_held"); v.GetValue() != "1010" || !tested.Msg.Result {
		t.Fatalf("the worker holds 1010 leases; TestStopRule read %v (result %v)", tested.Msg.Values, tested.Msg.Result)
	}
	clk.Advance(stoprule.DefaultTick)
	p := waitRuleProposal(t, srv, rule.RuleId)
	if p.NodeId != worker.Node.NodeId || valueOf(p.Rule.Values, "observed.leases_held").GetValue() != "1010" {
		t.Fatalf("proposal for %s with %v, want the worker with 1010 leases held", p.NodeId, p.Rule.Values)
	}
}
