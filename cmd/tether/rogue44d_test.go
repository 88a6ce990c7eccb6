package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
)

// rogue44dWorld is a real control plane on a manual clock with an
// operator's root "planner", its child "worker" (the rogue) and the
// rogue's child "helper", each with its credential.
type rogue44dWorld struct {
	srv   *testserver.Server
	clk   *clock.Manual
	admin *testserver.Clients
	nodes map[string]*tetherv1.Node
	creds map[string]string
}

func newRogue44DWorld(t *testing.T) *rogue44dWorld {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk))
	w := &rogue44dWorld{srv: srv, clk: clk, admin: srv.AdminClients(), nodes: map[string]*tetherv1.Node{}, creds: map[string]string{}}
	ctx := context.Background()
	root, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["planner"], w.creds["planner"] = root.Msg.Node, root.Msg.Credential
	for _, s := range []struct{ parent, name string }{{"planner", "worker"}, {"worker", "helper"}} {
		resp, err := srv.Clients(w.creds[s.parent]).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.nodes[s.parent].NodeId, Name: s.name}))
		if err != nil {
			t.Fatalf("spawn %s: %v", s.name, err)
		}
		w.nodes[s.name], w.creds[s.name] = resp.Msg.Node, resp.Msg.Credential
	}
	return w
}

// waitTermination waits for termination id to reach state (and, when
// terminated, its record), and returns it.
func (w *rogue44dWorld) waitTermination(t *testing.T, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	return testserver.WaitTermination(t, w.admin, id, state)
}

// recordRow is the row of `tether record ls` that lists record id.
func recordRow(t *testing.T, out, id string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, id) {
			return l
		}
	}
	t.Fatalf("tether record ls does not list %s:\n%s", id, out)
	return ""
}

// TestRogue44DRecordShowTellsANodeLeftToAnotherStop: the rogue worker
// drains its own child on a day's window; the operator then aborts the
// worker, which takes the child over, and the rogue's stop finishes at
// once with a record that lists the child superseded by the operator's
// abort. `tether record show` counted every node not confirmed as
// unaccounted: it printed the child UNACCOUNTED in the rogue's record
// (and `record ls` counted it there), with no word of the termination
// that does account for it, while the console (rogue43k) counts it apart
// and links that termination. The CLI now says the same: left to the
// operator's termination, named, and not unaccounted.
func TestRogue44DRecordShowTellsANodeLeftToAnotherStop(t *testing.T) {
	w := newRogue44DWorld(t)
	done, outerID := testserver.DrainLeftToAnotherStop(t, w.admin, w.srv.Clients(w.creds["worker"]), w.nodes["worker"].NodeId, w.nodes["helper"].NodeId)

	out := mustCLI(t, w.srv.URL, w.srv.Admin, "record", "show", done.RecordId)
	helper := w.nodes["helper"].NodeId
	if strings.Contains(out, "UNACCOUNTED  helper") || !strings.Contains(out, "Nodes: 0 confirmed, 0 unaccounted, 1 left to other terminations") {
		t.Errorf("tether record show counts the child, left to the operator's %s, unaccounted (or confirmed):\n%s", outerID, out)
	}
	if !strings.Contains(out, "left to      helper           "+helper+" by termination "+outerID+" (tether termination show "+outerID+")") {
		t.Errorf("tether record show does not name the termination %s that accounts for the child:\n%s", outerID, out)
	}
	row := recordRow(t, mustCLI(t, w.srv.URL, w.srv.Admin, "record", "ls", "--tree", helper), done.RecordId)
	if cells := strings.Fields(row); len(cells) != 9 || cells[5] != "0" || cells[6] != "1" {
		t.Errorf("tether record ls's row of the rogue's record: %q, want 0 unaccounted and 1 left to others", row)
	}
}

// TestRogue44DRecordShowSaysACallRanOnAfterItsCancel: the operator aborts
// the rogue with its http call in flight; the abort orders the call's
// cancel, and the rogue's tool server, instead of acknowledging it, lets
// the tool run on and reports the call completed afterwards. The record
// resolves the call completed, with the time its cancel was ordered, and
// `tether record show` printed it "completed" like any call that ended
// before the stop (its totals "1 completed"): an abort whose tool went on
// acting read as one that stopped it, where the console (rogue43k) lists
// it under Needs attention. The CLI now says it ran on after its cancel,
// when the cancel was ordered and when the call ended.
func TestRogue44DRecordShowSaysACallRanOnAfterItsCancel(t *testing.T) {
	w := newRogue44DWorld(t)
	ctx := context.Background()
	issued, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: w.nodes["worker"].NodeId, Scopes: []string{"tool:http"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	gate := w.srv.Clients(w.srv.ToolServerToken(t, "gate-http"))
	begun, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: issued.Msg.Token, Tool: "http", GateId: "gate-http"}))
	if err != nil {
		t.Fatal(err)
	}
	done := testserver.AbortWithACallRunOn(t, w.admin, gate, w.clk, w.nodes["worker"].NodeId, "gate-http", begun.Msg.Call.CallId, 5*time.Second)

	out := mustCLI(t, w.srv.URL, w.srv.Admin, "record", "show", done.RecordId)
	if !strings.Contains(out, "ran on after its cancel (ordered 09:30:00Z, ended 09:30:05Z)") {
		t.Errorf("tether record show does not say the call ran on after its cancel, ordered at 09:30:00Z and reported ended at 09:30:05Z:\n%s", out)
	}
	if !strings.Contains(out, "totals: 1 completed after its cancel\n") {
		t.Errorf("tether record show's totals count the call completed like one that ended before the stop:\n%s", out)
	}
	row := recordRow(t, mustCLI(t, w.srv.URL, w.srv.Admin, "record", "ls", "--tree", w.nodes["worker"].NodeId), done.RecordId)
	if cells := strings.Fields(row); len(cells) != 9 || cells[7] != "1" {
		t.Errorf("tether record ls's row of the stop: %q, want 1 call that ran on after its cancel", row)
	}
}

// rogue44dHostile is a rogue's text that acts on a terminal without an
// ESC byte of its own: the C1 controls as UTF-8 (CSI U+009B moves the
// cursor up a line and erases it, OSC U+009D sets the window's title,
// ended by ST U+009C), which VTE's terminals (GNOME Terminal and its
// kin), GNU screen and Mosh act on; a right-to-left override; a line
// separator; a DEL; a zero-width space; a tag character (past U+FFFF: a
// JSON escape of it is a surrogate pair).
const rogue44dHostile = "fine\u009b1A\u009b2K\u009d0;owned\u009c\u202eenil\u2028  confirmed    worker\x7f\u200b\U000e0041"

// terminalActing is the first rune of out that a terminal may act on or
// that hides what follows (a C1 control, DEL, a bidirectional control, a
// line or paragraph separator, a zero-width or tag character), or -1.
func terminalActing(out string) int {
	return strings.IndexFunc(out, func(r rune) bool {
		return r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 || r == 0x2028 || r == 0x2029 || r == 0x200b || r == 0xe0041
	})
}

// TestRogue44DJSONOutputCarriesNoTerminalControl: `-o json` is what the
// CLI offers for the whole of what it summarises (`tether record show`:
// "-o json for the full record"), read in the same terminal. The JSON
// encoder escapes the C0 controls (\u001b) but writes every other
// character as it is, so a rogue's text with the C1 controls written as
// UTF-8 (CSI U+009B, OSC U+009D), a right-to-left override or a line
// separator reached the operator's terminal as the rogue wrote it, in
// `record show -o json`, `proposal ls -o json`, `lease show -o json` and
// `lease evidence -o json`: on a VTE terminal "\u009b1A\u009b2K" moves the
// cursor up and erases the line above, where the table printed it
// escaped. Each is now written as a JSON escape (\u009b, \u202e), which
// reads back as the same string.
func TestRogue44DJSONOutputCarriesNoTerminalControl(t *testing.T) {
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.PrivilegeHandlers = map[string]privilege.PrivilegeRevoker{"db-role": revokeNothing{}}
	})
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	if _, err := w.rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: rogue44dHostile})); err != nil {
		t.Fatal(err)
	}
	if _, err := w.rogue.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.child.Node.NodeId, Kind: "db-role", ExternalId: rogue44dHostile, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour)),
	})); err != nil {
		t.Fatal(err)
	}
	l := w.holdJob(t, "job-1")
	if _, err := w.rogue.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: rogue44dHostile})); err != nil {
		t.Fatal(err)
	}
	term, err := w.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: w.child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0),
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, time.Minute, "the termination's record", func() bool {
		_, err := w.admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.Msg.Termination.TerminationId}))
		return err == nil
	})
	for _, args := range [][]string{
		{"proposal", "ls", "-o", "json"},
		{"record", "show", term.Msg.Termination.TerminationId, "-o", "json"},
		{"lease", "show", "job-1", "-o", "json"},
		{"lease", "evidence", "job-1", "-o", "json"},
	} {
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		if i := terminalActing(out); i >= 0 {
			t.Errorf("tether %s writes the rogue's %q to the terminal as it is:\n%q", strings.Join(args, " "), []rune(out[i:])[0], out)
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("tether %s: not JSON: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		if !holdsString(v, rogue44dHostile) {
			t.Errorf("tether %s: the JSON does not read back as the rogue's text:\n%s", strings.Join(args, " "), out)
		}
	}
}

// holdsString reports whether the decoded JSON v holds the string s.
func holdsString(v any, s string) bool {
	switch v := v.(type) {
	case string:
		return v == s
	case []any:
		for _, x := range v {
			if holdsString(x, s) {
				return true
			}
		}
	case map[string]any:
		for _, x := range v {
			if holdsString(x, s) {
				return true
			}
		}
	}
	return false
}

// TestRogue44DEvidenceCSVCarriesNoTerminalControl: `tether lease evidence
// JOB -o csv` writes the evidence matrix to the operator's terminal unless
// redirected (the README's tour prints it there), and its cells hold the
// holder's own text: a progress value. The CSV writer quotes a cell with a
// line break and writes every other byte as it is, so a rogue holder's
// progress value "\x1b[1A\x1b[2K\r…" moved the cursor up, erased the row
// above and wrote its own in its place, and a line break inside the quoted
// cell drew a row of the rogue's making. Each cell is now printed as the
// table prints it (\x1b, \r, \n written out); a cell that would start a
// spreadsheet formula still starts with an apostrophe.
func TestRogue44DEvidenceCSVCarriesNoTerminalControl(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	l := w.holdJob(t, "job-1")
	const forged = "job-1,l_forged,1,someone-else,…,CANCELLED,ACCEPTED RESOLVED"
	hostile := "40%\x1b[1A\x1b[2K\r" + forged + "\n" + forged + "\u009b2K"
	if _, err := w.rogue.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: hostile})); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, srv.URL, srv.Admin, "lease", "evidence", "job-1", "-o", "csv")
	if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f) }); i >= 0 {
		t.Fatalf("tether lease evidence -o csv writes the rogue's %q to the terminal as it is:\n%q", []rune(out[i:])[0], out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 { // the header and the offer's, the ack's and the progress's rows
		t.Errorf("tether lease evidence -o csv prints %d lines, want the header and 3 rows:\n%s", len(lines), out)
	}
	for _, line := range lines {
		if strings.HasPrefix(line, forged) {
			t.Errorf("tether lease evidence -o csv prints the rogue's forged row:\n%s", out)
		}
	}
	if !strings.Contains(out, `40%\x1b[1A\x1b[2K\r`+forged+`\n`) {
		t.Errorf("tether lease evidence -o csv does not show the rogue's progress value written out:\n%s", out)
	}
}
