package populated

import (
	"slices"
	"testing"
	"time"
)

func TestUnsetNamesEveryZeroField(t *testing.T) {
	type inner struct {
		At   time.Time
		Note string
	}
	type outer struct {
		Name   string
		Count  int32
		Tags   []string
		Labels map[string]string
		Inner  *inner
		Items  []inner
		Raw    []byte
		hidden string
	}
	full := outer{Name: "n", Count: 1, Tags: []string{"a"}, Labels: map[string]string{"k": "v"},
		Inner: &inner{At: time.Unix(1, 0), Note: "x"}, Items: []inner{{At: time.Unix(2, 0), Note: "y"}}, Raw: []byte{1}}
	if got := Unset(full); len(got) != 0 {
		t.Fatalf("a full value has unset fields %v", got)
	}
	part := full
	part.Count = 0
	part.Inner = &inner{Note: "x"}
	part.Items = []inner{{At: time.Unix(2, 0)}}
	part.Labels = map[string]string{"k": ""}
	part.Raw = nil
	want := []string{"Count", "Labels[k]", "Inner.At", "Items[0].Note", "Raw"}
	if got := Unset(part); !slices.Equal(got, want) {
		t.Fatalf("Unset = %v, want %v", got, want)
	}
}
