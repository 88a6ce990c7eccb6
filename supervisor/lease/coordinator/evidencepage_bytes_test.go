package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// A holder's progress values are its own text, up to lease.MaxValueBytes
// each: a rogue holder that fills a thousand rows with the largest values
// (control characters, which a reason quoting them writes four bytes each)
// made one page of its job's evidence tens of megabytes, past what many
// clients take in one message, so an operator's reader could not page
// through it. A page now stops at MaxEvidencePageBytes of text (at least
// one row), and the pages still hold every row once, in order.
func TestARogueHoldersLargeValuesDoNotMakeAnEvidencePageTooLargeToRead(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewManual(t0)
	h := start(t, st, clk, lease.DefaultPolicy())
	defer h.stop()
	h.active("big", "w1", time.Minute)
	value := strings.Repeat("\x01", lease.MaxValueBytes)
	const n = 600
	for seq := range uint64(n) {
		h.want(lease.Progress{Claim: claim("big", "L-big", 1, "w1"), ProgressSequence: seq + 1, ProgressValue: value}, lease.OutcomeAccepted, lease.EventProgressRecorded)
	}
	ctx := context.Background()
	text := func(rows []coordinator.Row) (n int) {
		for _, r := range rows {
			n += len(r.ProgressValue) + len(r.Reason)
		}
		return n
	}
	var got []coordinator.Row
	cursor, pages := coordinator.EvidenceCursor{}, 0
	for {
		page, err := h.c.EvidencePage(ctx, "big", cursor, 1000)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Rows) == 0 {
			t.Fatalf("page %d is empty with more to follow: %v", pages, page.More)
		}
		if b := text(page.Rows); b > coordinator.MaxEvidencePageBytes {
			t.Fatalf("page %d holds %d rows and %d bytes of text, want at most %d bytes", pages, len(page.Rows), b, coordinator.MaxEvidencePageBytes)
		}
		got = append(got, page.Rows...)
		if !page.More {
			break
		}
		cursor = page.Next
	}
	if len(got) != n+2 {
		t.Fatalf("the pages hold %d rows, want %d", len(got), n+2)
	}
	for i, r := range got {
		if r.Number != uint64(i+1) {
			t.Fatalf("row %d of the pages is numbered %d", i+1, r.Number)
		}
	}
	t.Logf("%d rows of %d-byte values in %d pages", len(got), lease.MaxValueBytes, pages)
}
