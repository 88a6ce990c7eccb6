package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRecordLsListsOneTreesOrOneRequestersRecords: `tether record ls`
// listed every record the control plane holds: an agent that stops its
// own children writes a record each time, and an operator looking for
// its own stop read through all of them. --tree and --requested-by now
// ask the server for one tree's, or one kind of requester's, only.
func TestRecordLsListsOneTreesOrOneRequestersRecords(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	ctx := context.Background()
	stop := func(c *testserver.Clients, node string) string {
		t.Helper()
		term, err := c.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: node})); err != nil {
			t.Fatal(err)
		}
		id := term.Msg.Termination.TerminationId
		var rec string
		testserver.WaitFor(t, 20*time.Second, "termination "+id+" to write its record", func() bool {
			got, err := w.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
			if err != nil {
				t.Fatal(err)
			}
			rec = got.Msg.Termination.RecordId
			return rec != ""
		})
		return rec
	}
	var agents []string
	for i := range 3 {
		child, err := w.rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.child.Node.NodeId, Name: fmt.Sprintf("c%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, stop(w.rogue, child.Msg.Node.NodeId))
	}
	other, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	operators := stop(w.admin, other.Msg.Node.NodeId)
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"--requested-by", "operator"}, []string{operators}, agents},
		{[]string{"--requested-by", "agent"}, agents, []string{operators}},
		{[]string{"--tree", w.child.Node.NodeId}, agents, []string{operators}},
		{[]string{"--tree", other.Msg.Node.NodeId, "--requested-by", "agent"}, nil, append([]string{operators}, agents...)},
	} {
		out := mustCLI(t, srv.URL, srv.Admin, append([]string{"record", "ls"}, c.args...)...)
		for _, id := range c.want {
			if !strings.Contains(out, id) {
				t.Errorf("tether record ls %s does not list %s:\n%s", strings.Join(c.args, " "), id, out)
			}
		}
		for _, id := range c.not {
			if strings.Contains(out, id) {
				t.Errorf("tether record ls %s lists %s, which it filters out:\n%s", strings.Join(c.args, " "), id, out)
			}
		}
	}
	if out, err := cli(t, srv.URL, srv.Admin, "record", "ls", "--requested-by", "someone"); err == nil || !strings.Contains(err.Error(), "operator, agent or rollout") {
		t.Errorf("tether record ls --requested-by someone: %v\n%s", err, out)
	}
}

// TestARoguesWideJobIdsDoNotShiftItsRowUnderOtherHeadings: the CLI's
// tables counted a character as one column, as text/tabwriter does: a
// rogue's job id in CJK characters (each drawn two columns wide) pushed
// the rest of its row right, its holder and state under other headings,
// and one carrying combining marks (drawn in no column) pulled it left.
// Each cell is now measured as a terminal draws it. (Fails if a row's
// holder does not start in the HOLDER column.)
func TestARoguesWideJobIdsDoNotShiftItsRowUnderOtherHeadings(t *testing.T) {
	srv := testserver.Start(t)
	w := startRogueWorld(t, srv)
	jobs := []string{"job-1", "\u4ed5\u4e8b\u4ed5\u4e8b\u4ed5\u4e8b\u4ed5\u4e8b-1", "\U0001F600\U0001F600\U0001F600-2", "e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301-3"}
	w.holdJobs(t, jobs...)
	out := mustCLI(t, srv.URL, srv.Admin, "lease", "list", "--holder", w.child.Node.NodeId)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != len(jobs)+1 {
		t.Fatalf("tether lease list printed %d lines, want a heading and %d rows:\n%s", len(lines), len(jobs), out)
	}
	col := func(line, what string) int {
		i := strings.Index(line, what)
		if i < 0 {
			t.Fatalf("%q is not in %q", what, line)
		}
		return termWidth(line[:i])
	}
	want := col(lines[0], "HOLDER")
	for _, line := range lines[1:] {
		if got := col(line, w.child.Node.NodeId); got != want {
			t.Errorf("a row's holder starts in column %d, the HOLDER heading in %d:\n%s", got, want, out)
		}
	}
}

// TestTablesAlignASCIIAsTabwriterDid: for ASCII cells the CLI's table
// writes what text/tabwriter wrote, blocks of lines with fewer cells
// included.
func TestTablesAlignASCIIAsTabwriterDid(t *testing.T) {
	for _, text := range []string{
		"A\tBB\tC\n1\t22222\t3\nlonger-cell\t\tlast\n",
		"key:\tvalue\nanother key:\tv\n",
		"H1\tH2\nno tabs here\nx\ty\tz\n\nw\tv\n",
		"a\tb\t\nc\td\t\n",
		"partial\tline",
	} {
		var want, got strings.Builder
		tw := tabwriter.NewWriter(&want, 0, 4, 2, ' ', 0)
		tw.Write([]byte(text))
		tw.Flush()
		tb := newTable(&got)
		tb.Write([]byte(text))
		if err := tb.Flush(); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("%q: table writes\n%q\ntabwriter wrote\n%q", text, got.String(), want.String())
		}
	}
}
