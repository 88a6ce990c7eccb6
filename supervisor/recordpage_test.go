package supervisor

import (
	"context"
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// readPages reads a record page by page and returns the pages.
func readPages(t *testing.T, s *Supervisor, terminationID string, size int) []*ReconciliationRecord {
	t.Helper()
	var pages []*ReconciliationRecord
	rec, next, err := s.RecordPage(context.Background(), "", terminationID, "", size)
	for {
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, rec)
		if next == "" {
			return pages
		}
		if len(pages) > 10000 {
			t.Fatal("the pages do not end")
		}
		rec, next, err = s.RecordPage(context.Background(), "", "", next, size)
	}
}

// joined appends the pages' entries to the first page's header.
func joined(pages []*ReconciliationRecord) *ReconciliationRecord {
	first := *pages[0]
	all := &first
	for _, p := range pages[1:] {
		all.Nodes = append(all.Nodes, p.Nodes...)
		all.ToolCalls = append(all.ToolCalls, p.ToolCalls...)
		all.Privileges = append(all.Privileges, p.Privileges...)
		all.Leases = append(all.Leases, p.Leases...)
	}
	return all
}

// TestRecordPagesEqualTheWholeRecord terminates a subtree of a few hundred
// nodes in chunks of 8, with the record's stored parts cut every 1,000
// bytes (so entries span parts and pages start inside parts), and reads
// its record in pages of 7 entries and in pages bounded by bytes: the
// pages put together are the record read whole, every node exactly once;
// a following page carries no header; without a page size the whole
// record comes in one answer, as before paging.
func TestRecordPagesEqualTheWholeRecord(t *testing.T) {
	defer func(b int) { recordPartBytes = b }(recordPartBytes)
	recordPartBytes = 1000
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 8)
	root, all := buildTree(t, st, 300, 6)
	term, err := s.Terminate(context.Background(), TerminateRequest{NodeID: root, Mode: ModeAbort, Reason: "pages", RequestedBy: "operator:test"})
	if err != nil {
		t.Fatal(err)
	}
	term = reconcileToEnd(t, s, term.ID)
	whole := checkRecord(t, s, term, all)

	one := readPages(t, s, term.ID, 0)
	if len(one) != 1 || !reflect.DeepEqual(one[0], whole) {
		t.Fatalf("without a page size: %d pages, equal to the record: %v; want the whole record in one", len(one), len(one) == 1 && reflect.DeepEqual(one[0], whole))
	}
	check := func(name string, pages []*ReconciliationRecord, want int) {
		t.Helper()
		if len(pages) < want {
			t.Fatalf("%s: %d pages, want at least %d", name, len(pages), want)
		}
		for i, p := range pages[1:] {
			if p.RecordID != "" || p.TerminationID != "" || len(p.Phases) != 0 || !p.WrittenAt.IsZero() {
				t.Fatalf("%s: page %d carries header fields", name, i+1)
			}
		}
		got := joined(pages)
		seen := map[string]int{}
		for _, n := range got.Nodes {
			seen[n.NodeID]++
		}
		for _, n := range all {
			if seen[n] != 1 {
				t.Fatalf("%s: node %s is in the pages %d times, want once", name, n, seen[n])
			}
		}
		if !reflect.DeepEqual(got, whole) {
			t.Fatalf("%s: the pages put together differ from the record read whole", name)
		}
	}
	check("page_size 7", readPages(t, s, term.ID, 7), len(all)/7)
	defer func(b int) { RecordPageBytes = b }(RecordPageBytes)
	RecordPageBytes = 4000
	pages := readPages(t, s, term.ID, 0)
	check("4,000 bytes a page", pages, 5)
	// ListRecords stays within the bound too: the record alone passes it,
	// so it is listed with its first page, and named partial.
	list, next, partial, err := s.Records(context.Background(), "", 100)
	if err != nil || len(list) != 1 || next != "" || len(partial) != 1 || partial[0] != term.RecordID || !reflect.DeepEqual(list[0], pages[0]) {
		t.Fatalf("Records within 4,000 bytes: %d records, next %q, partial %v, equal to the first page %v, %v",
			len(list), next, partial, len(list) == 1 && reflect.DeepEqual(list[0], pages[0]), err)
	}
}

// TestRecordPageTokenForged plays a caller that alters a page token: to
// read from elsewhere in the record, from a record the token was not given
// for, or from nothing at all. Each is refused with ErrInvalidArgument.
func TestRecordPageTokenForged(t *testing.T) {
	s, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 8)
	ctx := context.Background()
	var terms []Termination
	for range 2 {
		root, _ := buildTree(t, st, 40, 6)
		term, err := s.Terminate(ctx, TerminateRequest{NodeID: root, Mode: ModeAbort, Reason: "forged", RequestedBy: "operator:test"})
		if err != nil {
			t.Fatal(err)
		}
		terms = append(terms, reconcileToEnd(t, s, term.ID))
	}
	_, next, err := s.RecordPage(ctx, terms[0].RecordID, "", "", 5)
	if err != nil || next == "" {
		t.Fatalf("first page: next %q, %v; want a token", next, err)
	}
	good, err := parseRecordToken(next)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(c recordCursor) string { return c.token() }
	moved := good
	moved.Offset++
	otherPart := good
	otherPart.Part++
	resummed := good
	resummed.Offset++
	resummed.Sum = cursorSum(good.RecordID, good.Part, good.Offset+1, []byte("x"))
	foreign := good
	foreign.RecordID = terms[1].RecordID
	missing := good
	missing.RecordID = id.New(id.Record)
	cases := map[string]struct{ recordID, terminationID, token string }{
		"not base64":              {token: "!!!"},
		"random":                  {token: base64.RawURLEncoding.EncodeToString([]byte("hello"))},
		"offset moved":            {token: enc(moved)},
		"part moved":              {token: enc(otherPart)},
		"offset moved, re-summed": {token: enc(resummed)},
		"another record's id":     {token: enc(foreign)},
		"a record that is not":    {token: enc(missing)},
		"for another record_id":   {recordID: terms[1].RecordID, token: next},
		"for another termination": {terminationID: terms[1].ID, token: next},
		"too long":                {token: strings.Repeat("A", 4096)},
	}
	for name, c := range cases {
		_, _, err := s.RecordPage(ctx, c.recordID, c.terminationID, c.token, 5)
		if !errors.Is(err, tree.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	// The genuine token still reads, with or without the record's id.
	for _, rid := range []string{"", terms[0].RecordID} {
		page, _, err := s.RecordPage(ctx, rid, "", next, 5)
		if err != nil || len(page.Nodes) == 0 {
			t.Fatalf("genuine token (record_id %q): %v", rid, err)
		}
	}
	if _, _, err := s.RecordPage(ctx, "", terms[0].ID, next, 5); err != nil {
		t.Fatalf("genuine token with its termination_id: %v", err)
	}
}
