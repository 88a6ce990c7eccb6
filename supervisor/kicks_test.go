package supervisor

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestTerminationKicksOnlyWhatAChangeMayMove: the terminations a committed
// change kicks. Two unfinished terminations: "near", rooted at b (a child
// of a, under root r), placed; "far", rooted at y (under x), placed; and
// "fresh", rooted at q, not placed yet.
func TestTerminationKicksOnlyWhatAChangeMayMove(t *testing.T) {
	var k terminationKicks
	k.reset([]terminationPlace{{ID: "near", NodeID: "b"}, {ID: "far", NodeID: "y"}, {ID: "fresh", NodeID: "q"}})
	k.place("near", []string{"r", "a"})
	k.place("far", []string{"x"})

	node := func(n tree.Node) store.Event {
		b, err := tree.MarshalNode(&n)
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{Type: store.EventPut, Key: tree.NodeKey(n.NodeID), Value: b}
	}
	call := func(c ledger.ToolCall) store.Event { return callEvent(t, 1, c) }
	term := func(tp terminationPlace) store.Event {
		b, err := json.Marshal(tp)
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{Type: store.EventPut, Key: terminationKey(tp.ID), Value: b}
	}
	running, stopped := tree.NodeStateRunning, tree.NodeStateAborting
	all := []string{"far", "fresh", "near"}
	for _, tc := range []struct {
		name string
		ev   store.Event
		want []string
	}{
		{"a running node elsewhere", node(tree.Node{NodeID: "o", Ancestors: []string{"p"}, State: running}), nil},
		{"a stopped node elsewhere", node(tree.Node{NodeID: "o", Ancestors: []string{"p"}, State: stopped}), []string{"fresh"}},
		{"a running node above a root", node(tree.Node{NodeID: "a", Ancestors: []string{"r"}, State: running}), nil},
		{"a node above a root, stopped", node(tree.Node{NodeID: "a", Ancestors: []string{"r"}, State: stopped}), []string{"fresh", "near"}},
		{"a running node above a root, its exit confirmed", node(tree.Node{NodeID: "r", State: running, ExitedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}), []string{"fresh", "near"}},
		{"a root", node(tree.Node{NodeID: "b", Ancestors: []string{"r", "a"}, State: running}), []string{"near"}},
		{"a node below a root", node(tree.Node{NodeID: "c", Ancestors: []string{"r", "a", "b"}, State: running}), []string{"near"}},
		{"a node naming a termination", node(tree.Node{NodeID: "o", Ancestors: []string{"p"}, State: running, TerminationID: "far"}), []string{"far"}},
		{"a node naming a finished termination", node(tree.Node{NodeID: "o", State: running, TerminationID: "done"}), nil},
		{"a node deleted", store.Event{Type: store.EventDelete, Key: tree.NodeKey("o")}, all},
		{"a node not read", store.Event{Type: store.EventPut, Key: tree.NodeKey("o"), Value: []byte{0xff, 0xff}}, all},
		{"a call of no termination", call(ledger.ToolCall{CallID: "c1", NodeID: "o"}), nil},
		{"a call a termination accounts for", call(ledger.ToolCall{CallID: "c1", NodeID: "o", TerminationID: "near"}), []string{"near"}},
		{"a call deleted", store.Event{Type: store.EventDelete, Key: ledger.CallKey("c1")}, all},
		{"a termination's call listed", store.Event{Type: store.EventDelete, Key: ledger.TermCallKey("far", "c1")}, []string{"far"}},
		{"a termination's refusal listed", store.Event{Type: store.EventPut, Key: append(ledger.RefusedPrefix("far", "o"), "c1"...)}, []string{"far"}},
		{"an open call", store.Event{Type: store.EventPut, Key: ledger.OpenCallKey("o", "c1")}, nil},
		{"a node's count of open calls", store.Event{Type: store.EventPut, Key: ledger.OpenCountKey("o")}, nil},
		{"a cancel order", store.Event{Type: store.EventPut, Key: ledger.CancelKey("g", "c1")}, nil},
		{"a ledger key not known", store.Event{Type: store.EventPut, Key: []byte(ledger.Prefix + "new/x")}, all},
		{"a termination's put", term(terminationPlace{ID: "far", Phase: PhaseReconciling, NodeID: "y"}), []string{"far"}},
		{"a termination deleted", store.Event{Type: store.EventDelete, Key: terminationKey("far")}, all},
	} {
		var got []string
		k.changed([]store.Event{tc.ev}, func(id string) { got = append(got, id) }, func(string) { t.Fatal("nothing finished") })
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: kicked %v, want %v", tc.name, got, tc.want)
		}
	}

	// With none unfinished, nothing is kicked (nor decoded).
	var none terminationKicks
	none.reset(nil)
	none.changed([]store.Event{node(tree.Node{NodeID: "o", State: stopped}), {Type: store.EventDelete, Key: ledger.CallKey("c1")}},
		func(id string) { t.Errorf("with no termination unfinished, %s was kicked", id) }, func(string) {})

	// A new termination is kicked by its put, and, until placed, by every
	// stopped node; a finished one by nothing.
	var finished []string
	kicked := func(evs ...store.Event) []string {
		var got []string
		k.changed(evs, func(id string) { got = append(got, id) }, func(id string) { finished = append(finished, id) })
		slices.Sort(got)
		return got
	}
	if got := kicked(term(terminationPlace{ID: "new", Phase: PhaseRequested, NodeID: "z"})); !slices.Equal(got, []string{"new"}) {
		t.Errorf("a new termination's put kicked %v", got)
	}
	if got := kicked(node(tree.Node{NodeID: "o", State: stopped})); !slices.Equal(got, []string{"fresh", "new"}) {
		t.Errorf("a stopped node elsewhere kicked %v, want the terminations not placed", got)
	}
	if got := kicked(term(terminationPlace{ID: "near", Phase: PhaseTerminated, NodeID: "b"})); len(got) != 0 || !slices.Equal(finished, []string{"near"}) {
		t.Errorf("a finished termination's put kicked %v and finished %v", got, finished)
	}
	if got := kicked(node(tree.Node{NodeID: "c", Ancestors: []string{"r", "a", "b"}, State: stopped})); !slices.Equal(got, []string{"fresh", "new"}) {
		t.Errorf("a node of a finished termination's subtree kicked %v", got)
	}
}
