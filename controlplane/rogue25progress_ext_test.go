package controlplane_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAStopWhoseMarkIsUnderWayShowsNoExitConfirmed: an operator stops an
// agent and its child; the mark commits its roots' chunk and has not
// walked to the child. The termination's progress said every node marked
// so far had its exit confirmed ("requested · nodes 1/1 marked ·
// confirmed 1/1" in `tether terminate --wait`, the same in the console)
// before anyone had confirmed anything: confirmations were the members
// less a count of unconfirmed nodes that only the finished mark sets. Now
// a termination whose mark is under way shows no confirmation.
func TestAStopWhoseMarkIsUnderWayShowsNoExitConfirmed(t *testing.T) {
	var mu sync.Mutex
	marking := false
	rootsMarked, resume := make(chan struct{}), make(chan struct{})
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.TerminationChunk = 1
		cfg.TerminationFault = func(step string, n int) {
			mu.Lock()
			stop := marking && step == "mark" && n == 1
			if stop {
				marking = false
			}
			mu.Unlock()
			if stop {
				close(rootsMarked)
				<-resume
			}
		}
	})
	var resumed sync.Once
	free := func() { resumed.Do(func() { close(resume) }) }
	t.Cleanup(free)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	spawn(t, srv.Clients(rogue.Credential), rogue.Node.NodeId, "child")

	mu.Lock()
	marking = true
	mu.Unlock()
	term := terminate(t, admin, rogue.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Second, 0)
	<-rootsMarked
	got := getTermination(t, admin, term.TerminationId)
	if got.State != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED {
		t.Fatalf("the termination is %s while its mark is held after the roots' chunk, want requested", got.State)
	}
	p := got.Progress
	if p.GetNodesMarked() == 0 {
		t.Fatalf("the roots' chunk committed and the termination shows no node marked (%v)", p)
	}
	if p.GetConfirmations() != 0 {
		t.Fatalf("a termination whose mark is under way shows %d of %d exits confirmed; nobody has confirmed any", p.GetConfirmations(), p.GetNodesTotal())
	}

	free()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	p = getTermination(t, admin, term.TerminationId).Progress
	if p.GetNodesMarked() != 2 || p.GetNodesTotal() != 2 {
		t.Fatalf("the terminated stop shows %d of %d nodes marked, want 2 of 2", p.GetNodesMarked(), p.GetNodesTotal())
	}
}
