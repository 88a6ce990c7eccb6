package supervisor

import (
	"strings"
	"sync"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// The calls a waiting termination accounts for, kept in memory between the
// reconciler's passes.
//
// While a termination waits for its cancel acknowledgements (or its drain),
// every batch of acknowledgements wakes a pass, and each pass would read
// the calls not yet seen ended again, and list the calls again: a pass per
// batch, so the reads grow with the number of batches as well as the
// calls. Instead, the first pass of a wait reads them (at one revision)
// and keeps the state of each open call; the reconciler's own watch of the
// ledger then carries every later change of a call (its new value, with
// its revision), which moves the kept state forward. A pass reads no call.
//
// It is only a cache of stored state, in the direction the states move
// (in flight → cancel requested → ended): a state kept is never ahead of
// the store's, so a change not yet delivered delays the termination until
// its event arrives (which kicks it), and a restart starts empty. Behind
// is safe only within one wait: a state behind a step's own writes reads
// differently in the next phase (a drain's "in flight" is, to an abort, no
// acknowledgement pending), so each step drops what its wait kept
// (Reconcile). It is
// used only while the reconcile loop's watches run (Scan, called when they
// are established, turns it on and drops what it kept: a watch that
// lagged or failed costs it), never by passes run without the loop.
//
// The race: a call may change between the first pass's read (revision R)
// and the moment its kept state is stored; the event arrives before the
// cache knows the call. So while a read is in flight or anything is kept,
// every call event's state is noted (recent), and the read's result is
// moved forward by the notes newer than R. The notes are bounded: when
// they are dropped, floor says up to which revision, and a read at or
// below it keeps nothing.
type callCache struct {
	mu       sync.Mutex
	watching bool
	readers  int
	terms    map[string]*termCalls // termination → its open calls
	owner    map[string]string     // call → the termination that keeps it
	recent   map[string]callSeen
	floor    uint64
}

// termCalls are the open calls of one termination as of revision rev (and
// of the events since).
type termCalls struct {
	rev   uint64
	calls map[string]callSeen
}

type callSeen struct {
	rev   uint64
	state ledger.CallState
}

const maxRecentCalls = 1 << 16

var (
	callKeyPrefix     = string(ledger.CallKey(""))
	termCallKeyPrefix = strings.TrimSuffix(string(ledger.TermCallPrefix("x")), "x/")
)

// reset turns the cache on (the loop's watches are established) and drops
// what it kept.
func (c *callCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watching = true
	c.terms, c.owner, c.recent, c.floor = nil, nil, nil, 0
}

// drop forgets what is kept for a termination.
func (c *callCache) drop(term string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(term)
	c.tidy()
}

func (c *callCache) dropLocked(term string) {
	tc := c.terms[term]
	if tc == nil {
		return
	}
	for id := range tc.calls {
		delete(c.owner, id)
	}
	delete(c.terms, term)
}

// tidy drops the notes when nobody depends on them.
func (c *callCache) tidy() {
	if len(c.terms) == 0 && c.readers == 0 {
		c.recent, c.floor = nil, 0
	}
}

// apply moves the kept states forward by a batch of watched changes.
func (c *callCache) apply(batch []store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watching || len(c.terms) == 0 && c.readers == 0 {
		return
	}
	defer c.tidy()
	for _, ev := range batch {
		key := string(ev.Key)
		switch {
		case strings.HasPrefix(key, termCallKeyPrefix):
			// A call added to or moved off a termination's account (the
			// mark, a take-over): what it keeps is no longer the list.
			// (A change the kept read saw already, such as the mark's
			// own, changes nothing.)
			rest := key[len(termCallKeyPrefix):]
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				if tc := c.terms[rest[:i]]; tc != nil && ev.Revision > tc.rev {
					c.dropLocked(rest[:i])
				}
			}
		case strings.HasPrefix(key, callKeyPrefix):
			id := key[len(callKeyPrefix):]
			if ev.Type != store.EventPut {
				if term, ok := c.owner[id]; ok {
					c.dropLocked(term)
				}
				continue
			}
			var call ledger.ToolCall
			if ledger.UnmarshalCall(ev.Value, &call) != nil {
				if term, ok := c.owner[id]; ok {
					c.dropLocked(term)
				}
				continue
			}
			seen := callSeen{rev: ev.Revision, state: call.State}
			if c.readers > 0 {
				if c.recent == nil || len(c.recent) >= maxRecentCalls {
					for _, r := range c.recent {
						c.floor = max(c.floor, r.rev)
					}
					c.recent = make(map[string]callSeen)
				}
				if r, ok := c.recent[id]; !ok || r.rev < seen.rev {
					c.recent[id] = seen
				}
			}
			if term, ok := c.owner[id]; ok {
				c.forward(c.terms[term], id, seen)
			}
		}
	}
}

// forward moves one kept call to seen if seen is newer (ended: no longer
// kept).
func (c *callCache) forward(tc *termCalls, id string, seen callSeen) {
	if old, ok := tc.calls[id]; !ok || old.rev >= seen.rev {
		return
	}
	if seen.state == ledger.CallStateEnded {
		delete(tc.calls, id)
		delete(c.owner, id)
		return
	}
	tc.calls[id] = seen
}

// get returns the states of the open calls kept for term, if any.
func (c *callCache) get(term string) (states []ledger.CallState, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tc := c.terms[term]
	if tc == nil {
		return nil, false
	}
	for _, s := range tc.calls {
		states = append(states, s.state)
	}
	return states, true
}

// reading says whether the cache is on and, if it is, notes a read in
// flight (done must follow).
func (c *callCache) reading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watching {
		return false
	}
	c.readers++
	return true
}

// done ends a read; when it succeeded (calls: the open calls the
// termination accounts for, read at rev) it keeps them, moved forward by
// the changes noted since.
func (c *callCache) done(term string, rev uint64, calls map[string]ledger.CallState, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readers--
	if ok && c.watching && rev > c.floor && rev > 0 {
		c.dropLocked(term)
		tc := &termCalls{rev: rev, calls: make(map[string]callSeen, len(calls))}
		if c.terms == nil {
			c.terms, c.owner = map[string]*termCalls{}, map[string]string{}
		}
		for id, st := range calls {
			if other, taken := c.owner[id]; taken && other != term {
				c.dropLocked(other) // (moved between terminations: read afresh)
			}
			tc.calls[id] = callSeen{rev: rev, state: st}
			c.owner[id] = term
		}
		c.terms[term] = tc
		for id := range calls {
			if r, noted := c.recent[id]; noted {
				c.forward(tc, id, r)
			}
		}
	}
	c.tidy()
}
