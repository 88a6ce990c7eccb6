package supervisor

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// TestTerminationCloneIsDeep fails when Termination gains a field that
// clone would share between copies (a slice it does not copy, a map, a
// pointer), which would let one reader's change leak into the memo.
func TestTerminationCloneIsDeep(t *testing.T) {
	var orig Termination
	v := reflect.ValueOf(&orig).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Map, reflect.Pointer, reflect.Interface, reflect.Chan, reflect.Func:
			t.Fatalf("Termination.%s is a %s: clone must copy it", v.Type().Field(i).Name, f.Kind())
		}
	}
	c := orig.clone()
	cv := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		if v.Field(i).Kind() == reflect.Slice && v.Field(i).Pointer() == cv.Field(i).Pointer() {
			t.Errorf("clone shares Termination.%s with the original", v.Type().Field(i).Name)
		}
	}
}

// TestTerminationMemo checks that a large termination read twice decodes
// as json does, that a reader changing its copy changes nobody else's, and
// that new bytes under the same id are decoded afresh.
func TestTerminationMemo(t *testing.T) {
	term := Termination{ID: "t1", Phase: PhaseRequested, Roots: []string{"r"}}
	for i := range 2000 {
		term.Members = append(term.Members, fmt.Sprintf("node-%05d", i))
	}
	raw, err := json.Marshal(term)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < memoMinBytes {
		t.Fatalf("test termination of %d bytes is below the memo's threshold", len(raw))
	}
	m := &terminationMemo{entries: map[string]memoEntry{}}
	var first Termination
	if err := m.decode("t1", raw, &first); err != nil {
		t.Fatal(err)
	}
	first.Members[0] = "changed"
	first.Roots = append(first.Roots[:0], "changed")
	var second Termination
	if err := m.decode("t1", raw, &second); err != nil {
		t.Fatal(err)
	}
	var want Termination
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(second, want) {
		t.Fatalf("second read differs from the stored termination: members[0]=%q roots=%q", second.Members[0], second.Roots)
	}
	term.Phase = PhaseReconciling
	term.Members = term.Members[:1500]
	raw2, err := json.Marshal(term)
	if err != nil {
		t.Fatal(err)
	}
	var third Termination
	if err := m.decode("t1", raw2, &third); err != nil {
		t.Fatal(err)
	}
	if third.Phase != PhaseReconciling || len(third.Members) != 1500 {
		t.Fatalf("changed bytes read as phase %s with %d members, want reconciling with 1500", third.Phase, len(third.Members))
	}
	term.Phase = PhaseTerminated
	raw3, err := json.Marshal(term)
	if err != nil {
		t.Fatal(err)
	}
	var fourth Termination
	if err := m.decode("t1", raw3, &fourth); err != nil {
		t.Fatal(err)
	}
	if fourth.Phase != PhaseTerminated || len(m.entries) != 0 {
		t.Fatalf("a terminated termination read as %s, memo holds %d entries; want terminated and none", fourth.Phase, len(m.entries))
	}
}
