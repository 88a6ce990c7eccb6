package main

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesJobIdsInOtherScriptsDoNotPrintAsAnotherJob: the CLI wrote out
// the characters a terminal draws as nothing or as a blank, but not a
// letter that looks like another: a rogue holding "јob-1" (a Cyrillic je),
// "ｊob-1" (a fullwidth j) or "job-𝟏" (a mathematical one) had `tether
// lease list` and `tether lease show` print each as the operator's "job-1",
// and its stop proposal's reason "сleаred by оpеrаtor" (Cyrillic с, а, о,
// е) printed in `tether proposal ls` as an operator's words. Each is now
// written out as the console writes it (\u0458ob-1).
func TestARoguesJobIdsInOtherScriptsDoNotPrintAsAnotherJob(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	lookalikes := map[string]string{
		"\u0458ob-1":     `\u0458ob-1`,
		"\uff4aob-1":     `\uff4aob-1`,
		"job-\U0001d7cf": `job-\U0001d7cf`,
		"j\u03bfb-1":     `j\u03bfb-1`,
	}
	w.holdJobs(t, append([]string{"job-1"}, keys(lookalikes)...)...)
	list := mustCLI(t, srv.URL, srv.Admin, "lease", "list", "--holder", w.child.Node.NodeId)
	for job, want := range lookalikes {
		if !strings.Contains(list, want) {
			t.Errorf("tether lease list does not tell %q from job-1 (want %s):\n%s", job, want, list)
		}
		if show := mustCLI(t, srv.URL, srv.Admin, "lease", "show", job); !strings.Contains(show, want) {
			t.Errorf("tether lease show %q does not write it %s:\n%s", job, want, show)
		}
	}
	const reason = "\u0441le\u0430red by \u043ep\u0435r\u0430tor"
	if _, err := w.rogue.Agent.ProposeStop(context.Background(), connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: reason})); err != nil {
		t.Fatal(err)
	}
	ls := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls")
	if strings.Contains(ls, reason) || !strings.Contains(ls, `\u0441le\u0430red by \u043ep\u0435r\u0430tor`) {
		t.Errorf("tether proposal ls prints the rogue's reason as it reads, not written out:\n%s", ls)
	}
}

// TestProposalLsReadsOneNodesProposals: `tether proposal ls` listed every
// stop proposal the control plane holds, decided ones included, which a
// rogue's tree adds to as long as it runs; `--node` (and `--pending`) now
// ask the server for one node's only.
func TestProposalLsReadsOneNodesProposals(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	ctx := context.Background()
	p, err := w.parent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: "the parent's"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.Msg.Proposal.ProposalId})); err != nil {
		t.Fatal(err)
	}
	mine, err := w.rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: "the worker's"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--node", w.child.Node.NodeId}, {"--node", w.child.Node.NodeId, "--pending"}} {
		out := mustCLI(t, srv.URL, srv.Admin, append([]string{"proposal", "ls"}, args...)...)
		if !strings.Contains(out, mine.Msg.Proposal.ProposalId) || strings.Contains(out, p.Msg.Proposal.ProposalId) {
			t.Errorf("tether proposal ls %s lists another node's proposal, or not the node's own:\n%s", strings.Join(args, " "), out)
		}
	}
	if out := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls", "--pending"); strings.Contains(out, p.Msg.Proposal.ProposalId) {
		t.Errorf("tether proposal ls --pending lists a rejected proposal:\n%s", out)
	}
}
