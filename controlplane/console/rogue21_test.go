package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesRevocationsDoNotMakeTheFeedPageOpenLong: the revocation
// feed page opened its stream from the feed's start, so every live
// tombstone came to the page (which kept the newest 500): the rogue
// delegates 600 grants to its children and revokes them at once, and the
// page's opening carried all 600 before the first head. The page now
// asks for the newest 500 only (WatchRevocations' newest) and follows the
// feed from its head. (Fails if the opening carries more than the page
// shows, or not the newest.)
func TestARoguesRevocationsDoNotMakeTheFeedPageOpenLong(t *testing.T) {
	ctx := chrome(t)
	w := newWorld(t)
	bg := context.Background()
	rogue := w.srv.Clients(w.creds["rogue"])
	// Three children of 200 each: a node holds at most 256 live grants
	// delegated by agents (--grant-max-per-node).
	const grants, sinks = 600, 3
	var head uint64
	for s := range sinks {
		child, err := rogue.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.nodes["rogue"].NodeId, Name: fmt.Sprintf("sink-%d", s)}))
		if err != nil {
			t.Fatal(err)
		}
		sink := child.Msg.Node.NodeId
		for i := range grants / sinks {
			if _, err := rogue.Capability.Delegate(bg, connect.NewRequest(&tetherv1.DelegateRequest{
				ParentGrantId: w.grants["rogue"], HolderNodeId: sink, Scopes: []string{"tool:http"}, Ttl: durationpb.New(10 * time.Minute),
			})); err != nil {
				t.Fatalf("delegation %d to sink %d: %v", i, s, err)
			}
		}
		revoked, err := rogue.Capability.Revoke(bg, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: sink}, Reason: "churn"}))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(revoked.Msg.RevokedGrantIds); n != grants/sinks {
			t.Fatalf("the rogue revoked %d grants of sink %d, want %d", n, s, grants/sinks)
		}
		head = revoked.Msg.Sequence
	}

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	resp, err := b.hc.Get(w.srv.URL + "/ui/revocations/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seqs []uint64
	event := ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if event == "tombstone" {
			var tomb struct{ Sequence uint64 }
			if err := json.Unmarshal([]byte(data), &tomb); err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, tomb.Sequence)
			continue
		}
		if event == "head" {
			break
		}
	}
	if len(seqs) != 500 {
		t.Fatalf("the feed page's stream opened with %d tombstones before its first head, want the 500 it shows", len(seqs))
	}
	for i, seq := range seqs {
		if want := head - 499 + uint64(i); seq != want {
			t.Fatalf("tombstone %d of the opening is sequence %d, want %d (the newest 500, up to the head %d, in order)", i, seq, want, head)
		}
	}

	// In Chromium: 500 rows, the newest first.
	signInBrowser(t, ctx, w.srv.URL, w.srv.Admin)
	run(t, ctx, "the feed page", chromedp.Navigate(w.srv.URL+"/ui/revocations"), chromedp.WaitVisible(chromedp.CSS("#feed")))
	run(t, ctx, "the feed going live", chromedp.Poll[chromedp.Void](`document.querySelector("#feed-status").textContent === "Live."`))
	rows := get(t, ctx, "the feed's rows", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#feed tbody tr td:first-child")].map(td => td.textContent)`))
	if len(rows) != 500 || rows[0] != fmt.Sprint(head) || rows[499] != fmt.Sprint(head-499) {
		t.Fatalf("the feed page shows %d rows, first %q, last %q; want 500, %d down to %d", len(rows), first(rows), last(rows), head, head-499)
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

var recordRows = regexp.MustCompile(`<a href="/ui/records/(r_[^"]+)">`)

// TestARoguesOwnStopsDoNotPushAnOperatorsRecordsBack: the records page
// listed every record fifty at a time in the server's order, with no
// filter: the rogue stops its own children one by one, each stop writing
// a record, and the operator's record of worker-2's stop sank among
// them. The page (and ListRecords) now filter by tree and by who
// requested the stop, each from an index. (Fails if the operators' page
// shows a rogue's record or misses the operator's, or the rogue's tree's
// agents' page another's.)
func TestARoguesOwnStopsDoNotPushAnOperatorsRecordsBack(t *testing.T) {
	w := newWorld(t)
	bg := context.Background()
	rogueID := w.nodes["rogue"].NodeId
	rogue := w.srv.Clients(w.creds["rogue"])
	// The operator's stop first: its record would sort anywhere.
	op, err := w.admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.nodes["worker-2"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "operator's stop"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.nodes["worker-2"].NodeId})); err != nil {
		t.Fatal(err)
	}
	opRecord := w.waitTermination(t, op.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).RecordId
	const stops = 60
	rogueRecords := map[string]bool{}
	for i := range stops {
		child, err := rogue.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogueID, Name: fmt.Sprintf("c%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		term, err := rogue.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: child.Msg.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rogue.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Msg.Node.NodeId})); err != nil {
			t.Fatal(err)
		}
		rogueRecords[w.waitTermination(t, term.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).RecordId] = true
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	listed := func(path string) []string {
		t.Helper()
		p := b.get(path)
		if p.status != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, p.status, p.body)
		}
		var ids []string
		for _, m := range recordRows.FindAllStringSubmatch(p.body, -1) {
			ids = append(ids, m[1])
		}
		return ids
	}
	if got := listed("/ui/records?by=operator"); len(got) != 1 || got[0] != opRecord {
		t.Errorf("the operators' records page lists %d records (%v), want the operator's one, %s", len(got), got, opRecord)
	}
	agents := listed("/ui/records?by=agent&tree=" + rogueID)
	for _, id := range agents {
		if !rogueRecords[id] {
			t.Errorf("the agents' records of the rogue's tree list %s, not a record of the rogue's stops", id)
		}
	}
	if len(agents) != 50 {
		t.Errorf("the agents' records of the rogue's tree list %d on the first page, want 50", len(agents))
	}
	if p := b.get("/ui/records?by=agent&tree=" + rogueID); !strings.Contains(p.body, `id="records-next"`) || !strings.Contains(p.body, "by=agent") || !strings.Contains(p.body, "tree="+rogueID) {
		t.Errorf("the filtered page's next link does not keep the filter:\n%s", p.body)
	}
	if p := b.get("/ui/records?by=nobody"); p.status != http.StatusBadRequest {
		t.Errorf("an unknown requester: %d, want 400", p.status)
	}
}
