package agentsdk_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
	op := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	clk := &manualClock{now: time.Now().UTC()}
	logs := &countingHandler{}
	l, err := agentsdk.NewLauncher(agentsdk.LauncherConfig{
		Operator: op, Name: "selfstopper", Labels: map[string]string{"role": "worker"},
		Versions: helperVersions("TETHER_LAUNCHER_HELPER_SELFSTOP=1"), Start: "v1",
		PollEvery: 20 * time.Millisecond, Log: slog.New(logs), Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testserver.WaitFor(t, 60*time.Second, "the launcher to wait before restarting the self-stopping loop", func() bool {
		return logs.count("waiting before restarting the agent") > 0 || logs.count("agent started") > 6
	})
	if n := logs.count("agent started"); n != 2 {
		t.Fatalf("an agent stopping itself at once was started %d times before the launcher's clock moved; want 2 (the start and one restart at once)", n)
	}
	clk.advance(agentsdk.MinRestartBackoff)
	testserver.WaitFor(t, 60*time.Second, "the restart once the backoff passed", func() bool {
		return logs.count("agent started") >= 3 && logs.count("waiting before restarting the agent") >= 2
	})
	if n := logs.count("agent started"); n != 3 {
		t.Fatalf("after one backoff the self-stopping loop was started %d times; want 3", n)
	}
}
