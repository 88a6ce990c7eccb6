package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue38DALongReasonCannotWidenTheOperatorsTable: the rogue proposes
// its own stop with a reason of a kilobyte (what a reason may hold), which
// begins "calm", thirty spaces and "t_forged". `tether proposal ls` made
// its REASON column as wide as the widest reason: every row of the table,
// the honest ones too, was over a thousand columns wide, its TERMINATION
// a screen or more to the right, wrapped by the terminal into lines that
// began mid-row; and the spaces inside the reason read as the gap between
// two cells, t_forged as a TERMINATION of its own. A cell is now cut at
// maxCell columns with a marker naming -o wide, which prints every cell
// whole, and a space at a cell's end or beside another is written out
// (\x20).
func TestRogue38DALongReasonCannotWidenTheOperatorsTable(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	if _, err := w.parent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: "the parent's"})); err != nil {
		t.Fatal(err)
	}
	tail := strings.Repeat("z", 1024-len("calm")-30-len("t_forged ")-len(" end"))
	reason := "calm" + strings.Repeat(" ", 30) + "t_forged " + tail + " end"
	if len(reason) != 1024 {
		t.Fatalf("the reason is %d bytes", len(reason))
	}
	if _, err := w.rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: reason})); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("tether proposal ls printed %d lines, want the header and two rows:\n%s", len(lines), out)
	}
	for _, l := range lines {
		if termWidth(l) > 200 {
			t.Fatalf("tether proposal ls printed a line %d columns wide (a rogue's reason widened the table):\n%s", termWidth(l), out)
		}
	}
	var rogue, honest string
	for _, l := range lines[1:] {
		if strings.Contains(l, w.child.Node.NodeId) {
			rogue = l
		} else {
			honest = l
		}
	}
	if !strings.Contains(honest, "the parent's") {
		t.Fatalf("the parent's row does not show its reason:\n%s", out)
	}
	if !strings.Contains(rogue, "calm") || !strings.Contains(rogue, "-o wide") {
		t.Fatalf("the rogue's row does not show the start of its reason cut, with a marker naming -o wide:\n%s", out)
	}
	if strings.Contains(rogue, "calm  ") || strings.Contains(rogue, " end") {
		t.Fatalf("the rogue's row shows its reason's spaces as a gap between cells, or its reason whole:\n%s", out)
	}
	// -o wide prints the reason whole (its spaces written out), -o json as
	// written.
	wide := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls", "-o", "wide")
	if !strings.Contains(wide, "calm"+strings.Repeat(`\x20`, 30)+"t_forged "+tail+" end") {
		t.Fatalf("tether proposal ls -o wide does not print the rogue's reason whole:\n%s", wide)
	}
	if js := mustCLI(t, srv.URL, srv.Admin, "proposal", "ls", "-o", "json"); !strings.Contains(js, reason) {
		t.Fatalf("tether proposal ls -o json does not carry the reason as written:\n%s", js)
	}
	// A table's first column, the row's id, is never cut: two long job ids
	// that began alike would print alike.
	job := "job-" + strings.Repeat("j", 120)
	w.holdJobs(t, job)
	if out := mustCLI(t, srv.URL, srv.Admin, "lease", "list"); !strings.Contains(out, job+"  ") {
		t.Fatalf("tether lease list does not print the long job id whole:\n%s", out)
	}
}

// TestRogue38DAgentListNamesEachNodesAncestors: the rogue ("worker", under
// root) spawns a child named "worker-2" with the real worker-2's labels.
// `tether agent ls --selector role=worker`, what an operator stopping the
// workers reads, printed each node's name, id and parent's id: the two
// worker-2 rows read alike but for two ids, and the operator who stopped
// "worker-2" from the listing could stop the rogue's child and leave the
// real one running. Each row now names the node's ancestors, root first
// (PATH), the impostor's root/worker, the real one's root.
func TestRogue38DAgentListNamesEachNodesAncestors(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	root := w.child.Node.Ancestors[0]
	labels := map[string]string{"role": "worker"}
	real, err := w.parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root, Name: "worker-2", Labels: labels}))
	if err != nil {
		t.Fatal(err)
	}
	fake, err := w.rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.child.Node.NodeId, Name: "worker-2", Labels: labels}))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"agent", "ls", "--selector", "role=worker"}, {"agent", "ls", "--root", root}} {
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		lines := strings.Split(out, "\n")
		if h := strings.Fields(lines[0]); len(h) < 3 || h[2] != "PATH" {
			t.Fatalf("tether %s has no PATH column after the name:\n%s", strings.Join(args, " "), out)
		}
		row := func(id string) []string {
			for _, l := range lines {
				if f := strings.Fields(l); len(f) > 0 && f[0] == id {
					return f
				}
			}
			t.Fatalf("tether %s does not list %s:\n%s", strings.Join(args, " "), id, out)
			return nil
		}
		if f := row(real.Msg.Node.NodeId); f[1] != "worker-2" || f[2] != "root" {
			t.Fatalf("tether %s: the real worker-2's row %q, want its path root:\n%s", strings.Join(args, " "), f, out)
		}
		if f := row(fake.Msg.Node.NodeId); f[1] != "worker-2" || f[2] != "root/worker" {
			t.Fatalf("tether %s: the rogue's worker-2's row %q, want its path root/worker:\n%s", strings.Join(args, " "), f, out)
		}
		if args[2] != "--root" {
			continue
		}
		if f := row(root); f[2] != "-" {
			t.Fatalf("tether %s: the root's row %q, want no path (-):\n%s", strings.Join(args, " "), f, out)
		}
	}
}

// TestRogue38DRecordListIsReadAPageAtATime: the rogue stops its own
// children one at a time, each stop writing a record. `tether record ls`
// read every page of records and printed them all, so an operator
// looking for the record of their own stop waited for, and scrolled
// past, every record the rogue had made (as many as its budget pays for,
// for as long as it runs). It now prints --limit records (1,000) and the
// --page-token of the next page, as `tether agent ls` does.
func TestRogue38DRecordListIsReadAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	const stops = 5
	for i := range stops {
		kid, err := w.rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.child.Node.NodeId, Name: fmt.Sprintf("kid-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		term, err := w.rogue.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
			NodeId: kid.Msg.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
			CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0),
		}))
		if err != nil {
			t.Fatal(err)
		}
		testserver.WaitFor(t, time.Minute, "the record of the rogue's stop", func() bool {
			_, err := w.admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.Msg.Termination.TerminationId}))
			return err == nil
		})
	}
	seen := pageThrough(t, srv, "record", stops)
	for r, n := range seen {
		if n != 1 {
			t.Fatalf("record %s listed %d times", r, n)
		}
	}
	if _, err := cli(t, srv.URL, srv.Admin, "record", "ls", "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("tether record ls --limit 0: %v, want a refusal naming --limit", err)
	}
}

// TestRogue38DProposalListIsReadAPageAtATime: the rogue proposes its own
// stop again each time it is rejected (a policy that rejects agents'
// proposals does it at once), every decided proposal kept. `tether
// proposal ls` read every page of proposals and printed them all, so the
// pending proposal an operator had to decide was one line among every
// proposal the rogue ever made. It now prints --limit proposals (1,000)
// and the --page-token of the next page.
func TestRogue38DProposalListIsReadAPageAtATime(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	const proposals = 5
	for i := range proposals {
		p, err := w.rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1", Reason: fmt.Sprintf("again %d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.Msg.Proposal.ProposalId, Approve: false, Reason: "no"})); err != nil {
			t.Fatal(err)
		}
	}
	seen := pageThrough(t, srv, "proposal", proposals)
	for p, n := range seen {
		if n != 1 {
			t.Fatalf("proposal %s listed %d times", p, n)
		}
	}
}

// pageThrough follows `tether <noun> ls --limit 2` and the next-page
// command each page prints to the end, checks that no page holds more
// than 2 rows and that want distinct ids were listed, and returns how
// many times each id was.
func pageThrough(t *testing.T, srv *testserver.Server, noun string, want int) map[string]int {
	t.Helper()
	return pageThroughArgs(t, srv, []string{noun, "ls"}, want)
}

// pageThroughArgs is pageThrough of the listing command list (its noun
// and verb: "lease", "list").
func pageThroughArgs(t *testing.T, srv *testserver.Server, list []string, want int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	noun := list[0]
	args := append(slices.Clone(list), "--limit", "2")
	for pages := 0; ; pages++ {
		if pages > want {
			t.Fatalf("tether %s --limit 2 pages on past %d %ss: %v", noun, want, noun, seen)
		}
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		more := ""
		if last := lines[len(lines)-1]; strings.HasPrefix(last, "… more: ") {
			more, lines = last, lines[:len(lines)-1]
		}
		if len(lines)-1 > 2 {
			t.Fatalf("tether %s printed %d %ss, want at most 2:\n%s", strings.Join(args, " "), len(lines)-1, noun, out)
		}
		for _, l := range lines[1:] {
			seen[strings.Fields(l)[0]]++
		}
		if more == "" {
			break
		}
		args = strings.Fields(strings.TrimPrefix(more, "… more: tether "))
	}
	if len(seen) != want {
		t.Fatalf("the pages of tether %s --limit 2 listed %d %ss, want %d: %v", strings.Join(list, " "), len(seen), noun, want, seen)
	}
	return seen
}
