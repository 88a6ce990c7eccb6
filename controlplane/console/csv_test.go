package console

import (
	"slices"
	"testing"
)

func TestSpreadsheetSafeDefusesFormulas(t *testing.T) {
	got := spreadsheetSafe([]string{"job-1", "=HYPERLINK(\"http://evil\")", "+1", "-2", "@SUM(A1)", "\tx", "1 / =x", "", "2026-03-02T09:30:00Z"})
	want := []string{"job-1", "'=HYPERLINK(\"http://evil\")", "'+1", "'-2", "'@SUM(A1)", "'\tx", "1 / =x", "", "2026-03-02T09:30:00Z"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
