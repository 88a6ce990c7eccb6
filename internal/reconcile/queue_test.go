package reconcile

import (
	"fmt"
	"strings"
	"testing"
)

// The keys ready at once are served by group in turn: a group that made
// many keys ready (a rogue's terminations whose deadlines pass together)
// has one served before another group's key that was added after them
// all, then that group's, then its own second; within a group, the order
// added. With no Group, the order added.
func TestTheReadyKeysAreServedByGroupInTurn(t *testing.T) {
	group := func(key string) string { g, _, _ := strings.Cut(key, "/"); return g }
	q := newQueue(group)
	for i := range 100 {
		q.add(fmt.Sprintf("rogue/%d", i))
	}
	q.add("victim/a")
	q.add("other/a")
	q.add("victim/b")
	var got []string
	for range 6 {
		k := q.take()
		got = append(got, k)
		q.done(k)
	}
	want := "rogue/0 victim/a other/a rogue/1 victim/b rogue/2"
	if strings.Join(got, " ") != want {
		t.Fatalf("served %v, want %s", got, want)
	}
	// A key kicked again while it waits keeps its place; the rest of the
	// rogue's lane is served in the order added.
	q.add("rogue/50")
	for i := 3; i < 100; i++ {
		if k := q.take(); k != fmt.Sprintf("rogue/%d", i) {
			t.Fatalf("served %s, want rogue/%d", k, i)
		}
	}
	if k := q.take(); k != "" {
		t.Fatalf("served %s after every ready key, want none", k)
	}

	plain := newQueue(nil)
	for _, k := range []string{"rogue/0", "rogue/1", "victim/a"} {
		plain.add(k)
	}
	for _, want := range []string{"rogue/0", "rogue/1", "victim/a"} {
		if k := plain.take(); k != want {
			t.Fatalf("without groups served %s, want %s", k, want)
		}
	}
}
