package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherhq/tether/supervisor"
)

// rogue42lReads is the most GetRecord answers one record page may read.
const rogue42lReads = 4

// TestRogue42LRecordPageReadsABoundedPartOfARoguesRecord: the rogue
// spawns children, none of which ever confirms its exit, and the operator
// stops worker-1, its parent. The record lists the rogue's whole subtree
// (a hundred thousand nodes as far as its budget allows, each with what
// it held and up to sixteen contradictions), and the record page read
// every answer of it (every page of GetRecord, a few MiB each) into memory
// to count it, on every load, in the control plane's own process, before
// drawing its 500 rows. With the server's pages made small, the record
// spans more answers than a page reads: the page now reads at most four,
// says that its counts and lists are of the entries read and where the
// whole record is, and claims no longer that every agent confirmed its
// exit when it has not read them all.
func TestRogue42LRecordPageReadsABoundedPartOfARoguesRecord(t *testing.T) {
	pageBytes := supervisor.RecordPageBytes
	t.Cleanup(func() { supervisor.RecordPageBytes = pageBytes }) // after the server's own cleanup
	supervisor.RecordPageBytes = 300
	w := newWorld(t)
	done, nodes, _ := stopTheRoguesParent(t, w, 16)
	cc := &countingConsole{}
	b := newBrowser(t, cc.start(t, w))
	b.signIn(w.srv.Admin)

	p := b.get("/ui/records/" + done.RecordId)
	if p.status != http.StatusOK {
		t.Fatalf("the record page: %d\n%s", p.status, p.body)
	}
	if n := cc.takeCalls("GetRecord"); n > rogue42lReads {
		t.Fatalf("the record page read %d GetRecord answers of a record of %d nodes; want at most %d", n, nodes, rogue42lReads)
	}
	for _, want := range []string{`id="record-partial"`, "tether record show " + done.RecordId} {
		if !strings.Contains(p.body, want) {
			t.Fatalf("the record page read part of the record and does not say so (%q):\n%s", want, p.body)
		}
	}
	if strings.Contains(p.body, `id="all-accounted"`) {
		t.Fatalf("the record page says every agent confirmed its exit from part of the record:\n%s", p.body)
	}
	// The JSON download still holds the whole record.
	j := b.get("/ui/records/" + done.RecordId + "/json")
	var whole struct {
		Nodes []json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(j.body), &whole); j.status != http.StatusOK || err != nil || len(whole.Nodes) != nodes {
		t.Fatalf("the record's JSON: %d, %d nodes (%v), want the record's %d", j.status, len(whole.Nodes), err, nodes)
	}
}
