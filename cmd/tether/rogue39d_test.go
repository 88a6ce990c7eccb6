package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue39DGrantListIsReadAPageAtATime: the rogue delegates its grant
// to its child and revokes the delegation, again and again; revoked
// grants are kept. `tether grant ls` read every page of grants and
// printed them all, so an operator looking for the grant to revoke
// waited for, and scrolled past, every grant the rogue ever delegated.
// It now prints --limit grants (1,000) and the --page-token of the next
// page, as `tether record ls` does.
func TestRogue39DGrantListIsReadAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	const delegations = 4
	rogueDelegatesAndRevokes(t, w, delegations)
	seen := pageThroughArgs(t, srv, []string{"grant", "ls"}, 1+delegations)
	for g, n := range seen {
		if n != 1 {
			t.Fatalf("grant %s listed %d times", g, n)
		}
	}
	if _, err := cli(t, srv.URL, srv.Admin, "grant", "ls", "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("tether grant ls --limit 0: %v, want a refusal naming --limit", err)
	}
}

// rogueDelegatesAndRevokes has the rogue's child, holding a grant the
// operator issued it (whose id it returns), delegate it to the child's
// own child and revoke the delegation, n times: n revoked grants kept,
// each derived from the operator's.
func rogueDelegatesAndRevokes(t *testing.T, w rogueWorld, n int) string {
	t.Helper()
	ctx := context.Background()
	kid, err := w.rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.child.Node.NodeId, Name: "kid"}))
	if err != nil {
		t.Fatal(err)
	}
	own, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: w.child.Node.NodeId, Scopes: []string{"tool:http"}}))
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		d, err := w.rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: own.Msg.Grant.GrantId, HolderNodeId: kid.Msg.Node.NodeId, Scopes: []string{"tool:http"}}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: d.Msg.Grant.GrantId}, Reason: "again"})); err != nil {
			t.Fatal(err)
		}
	}
	return own.Msg.Grant.GrantId
}

// TestRogue39DLeaseListIsReadAPageAtATime: the rogue holds jobs whose ids
// sort first ("aaa-…"; whoever offers a job chooses its id), as many as
// its lineage's bound lets it keep, and lets them end and be offered
// again under new ids. `tether lease list` read every page of leases and
// printed them all, so an operator looking for one job's lease waited
// for, and scrolled past, every lease of the rogue's. It now prints
// --limit leases (1,000) and the --page-token of the next page. That
// token is the server's, the last job id listed, and the job ids are the
// rogue's: one ending ";tether${IFS}agent${IFS}terminate${IFS}<the planner>;#" made the
// next-page line an operator copies into a shell a second command. The
// token is printed base64url-encoded, letters, digits, '-' and '_' only.
func TestRogue39DLeaseListIsReadAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	const jobs = 5
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("aaa-%d;tether${IFS}agent${IFS}terminate${IFS}%s;#", i, w.child.Node.ParentNodeId)
	}
	w.holdJobs(t, ids...)
	out := mustCLI(t, srv.URL, srv.Admin, "lease", "list", "--limit", "2")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	more := lines[len(lines)-1]
	token, ok := strings.CutPrefix(more, "… more: tether lease list --page-token ")
	if !ok {
		t.Fatalf("tether lease list --limit 2 of %d leases ends %q, want the next page's command:\n%s", jobs, more, out)
	}
	token, _ = strings.CutSuffix(token, " --limit 2")
	if strings.Trim(token, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
		t.Fatalf("the next page's token %q holds more than letters, digits, '-' and '_': the job id of the rogue's choosing, for an operator to paste into a shell", token)
	}
	seen := pageThroughArgs(t, srv, []string{"lease", "list"}, jobs)
	for j, n := range seen {
		if n != 1 {
			t.Fatalf("lease of job %s listed %d times", j, n)
		}
	}
	if _, err := cli(t, srv.URL, srv.Admin, "lease", "list", "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("tether lease list --limit 0: %v, want a refusal naming --limit", err)
	}
}
