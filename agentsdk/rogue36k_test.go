package agentsdk_test

import (
	"testing"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/supervisor"
)

// TestRogue36KLauncherBacksOffAnAgentThatStopsItself: the launcher backs
// off the restarts of an agent that dies unasked, but it replaced a drained
// node at once whoever asked for the drain. Under a label policy that
// approves an agent's own stop proposal (AutoApprove), a crash loop that
// proposes its own stop before dying is drained by the policy: every
// version was restarted as fast as it died, a root node, a termination and
// a record per start, the backoff dodged. A drain the policy started (no
// operator weighed it: the agent's own proposal, or a rule) is an exit
// nobody outside the workload asked for: its restart backs off.
func TestRogue36KLauncherBacksOffAnAgentThatStopsItself(t *testing.T) {
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.StopPolicy = supervisor.ProposalPolicy{AutoApprove: map[string]string{"role": "worker"}}
	})
	restartsBackOff(t, srv, agentsdk.LauncherConfig{
		Name: "selfstopper", Labels: map[string]string{"role": "worker"}, Versions: helperVersions("TETHER_LAUNCHER_HELPER_SELFSTOP=1"),
	}, "an agent stopping itself at once")
}
