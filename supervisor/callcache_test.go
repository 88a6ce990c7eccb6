package supervisor

import (
	"testing"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
	"github.com/tetherhq/tether/supervisor/ledger"
)

func callEvent(t *testing.T, rev uint64, c ledger.ToolCall) store.Event {
	t.Helper()
	b, err := storecodec.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return store.Event{Type: store.EventPut, Key: ledger.CallKey(c.CallID), Value: b, Revision: rev}
}

// A call that ends after the first pass of a wait read it, but whose event
// arrives before that pass kept what it read, is not kept open: the read is
// moved forward by the changes noted while it was in flight (else the
// termination would wait for an acknowledgement it already has, with no
// event left to wake it).
func TestTheKeptCallsTakeTheChangesThatArrivedDuringTheirRead(t *testing.T) {
	term, a, b := id.New(id.Termination), id.New(id.Call), id.New(id.Call)
	var c callCache
	c.reset()
	if !c.reading() {
		t.Fatal("the cache is off while the loop's watches run")
	}
	// Read at revision 5: both calls wait for their acknowledgement; a
	// is acknowledged at 7, its event delivered before the read is kept.
	c.apply([]store.Event{callEvent(t, 7, ledger.ToolCall{CallID: a, State: ledger.CallStateEnded})})
	c.done(term, 5, map[string]ledger.CallState{a: ledger.CallStateCancelRequested, b: ledger.CallStateCancelRequested}, true)
	states, ok := c.get(term)
	if !ok || len(states) != 1 {
		t.Fatalf("kept %v (%v), want the one call still waiting", states, ok)
	}
	// An event the read saw already (the mark's own listing) keeps them;
	// a later change of the termination's list drops them.
	c.apply([]store.Event{{Type: store.EventPut, Key: ledger.TermCallKey(term, b), Revision: 4}})
	if _, ok := c.get(term); !ok {
		t.Fatal("a change older than the read dropped the kept calls")
	}
	c.apply([]store.Event{callEvent(t, 8, ledger.ToolCall{CallID: b, State: ledger.CallStateEnded})})
	if states, _ := c.get(term); len(states) != 0 {
		t.Fatalf("kept %v after the last call ended, want none", states)
	}
	c.apply([]store.Event{{Type: store.EventDelete, Key: ledger.TermCallKey(term, b), Revision: 9}})
	if _, ok := c.get(term); ok {
		t.Fatal("a call moved off the termination's account left its kept calls in place")
	}
}

// Passes run without the reconcile loop (no watch carries the changes)
// keep nothing.
func TestTheCallCacheIsOffWithoutTheLoop(t *testing.T) {
	var c callCache
	if c.reading() {
		t.Fatal("the cache is on with no watch running")
	}
}
