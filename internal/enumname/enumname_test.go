package enumname

import "testing"

type kind int32

type small uint8

func TestOf(t *testing.T) {
	names := []string{"UNSPECIFIED", "ONE", "", "THREE"}
	for _, c := range []struct {
		v       kind
		unknown string
		want    string
	}{
		{0, "", "UNSPECIFIED"},
		{1, "kind", "ONE"},
		{3, "", "THREE"},
		{2, "", "2"},           // a gap in the table
		{2, "kind", "kind(2)"}, // a gap, with a word for the unknown
		{4, "", "4"},
		{-1, "", "-1"},
		{-1, "UNKNOWN", "UNKNOWN(-1)"},
		{99, "phase", "phase(99)"},
	} {
		if got := Of(names, c.v, c.unknown); got != c.want {
			t.Errorf("Of(%d, %q) = %q, want %q", c.v, c.unknown, got, c.want)
		}
	}
	if got := Of(names, small(255), ""); got != "255" {
		t.Errorf("an unsigned value past the table reads %q, want 255", got)
	}
	if got := Of(names, small(1), ""); got != "ONE" {
		t.Errorf("small(1) reads %q, want ONE", got)
	}
}
