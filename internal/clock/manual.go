package clock

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Manual is a clock moved only by its owner. Tests use it so that behaviour
// never depends on the real passage of time: Advance and Set move the
// clock at once, then fire every timer that came due, in deadline order
// (timers due at the same instant in the order they were armed), before
// they return.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	timers  manualHeap
	seq     uint64
	changed chan struct{} // closed and replaced when the pending timers change

	// jump, when set (JumpAsNextFuncArms), moves the clock as the next
	// timed function is armed; jumped is closed once it has.
	jumpMu sync.Mutex
	jump   time.Duration
	jumped chan struct{}
}

// NewManual returns a manual clock set to start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start.UTC(), changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d, firing the timers that came due.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	target := m.now.Add(d)
	m.mu.Unlock()
	m.moveTo(target)
}

// Set moves the clock to t. Moving forward fires the timers that came due;
// moving back fires none (they fire when the clock reaches them again).
func (m *Manual) Set(t time.Time) { m.moveTo(t.UTC()) }

// moveTo sets the clock to target, then fires the timers due by then one
// at a time in deadline order. The clock reads target throughout, as the
// real one would after a jump, so a worker that a timer wakes never sees a
// time between the old reading and the new. A timer's function runs
// without the clock's lock, so it may arm, stop or reset timers; one it
// arms is due no earlier than target plus its duration, so a worker that
// re-arms itself runs once per move, as a ticker drops the ticks its
// receiver missed.
func (m *Manual) moveTo(target time.Time) {
	m.mu.Lock()
	m.now = target
	m.mu.Unlock()
	for {
		m.mu.Lock()
		if len(m.timers) == 0 || m.timers[0].at.After(m.now) {
			m.mu.Unlock()
			return
		}
		t := heap.Pop(&m.timers).(*manualTimer)
		m.notifyLocked()
		f := t.fireLocked()
		m.mu.Unlock()
		if f != nil {
			f()
		}
	}
}

// Waiters is how many timers are pending.
func (m *Manual) Waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.timers)
}

// BlockUntil waits until at least n timers are pending — a worker has armed
// the wake-up a test is about to make due — or ctx ends.
func (m *Manual) BlockUntil(ctx context.Context, n int) error {
	for {
		m.mu.Lock()
		pending, changed := len(m.timers), m.changed
		m.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Armed reports whether a timer is pending with deadline t: a test that
// knows the wake-up a worker must arm waits for it before moving the clock.
func (m *Manual) Armed(t time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range m.timers {
		if x.at.Equal(t) {
			return true
		}
	}
	return false
}

func (m *Manual) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// NewTimer arms a timer d from now; one already due fires at once.
func (m *Manual) NewTimer(d time.Duration) Timer {
	t := &manualTimer{m: m, c: make(chan time.Time, 1), index: -1}
	t.Reset(d) // arming a new timer is resetting one that never ran
	return t
}

// NewTimerAt arms a timer for t, whatever the clock reads as it is armed;
// one already due fires at once (clock.NewTimerAt).
func (m *Manual) NewTimerAt(t time.Time) Timer {
	return m.armAt(&manualTimer{m: m, c: make(chan time.Time, 1), index: -1}, t)
}

// AfterFuncAt arms f for t, whatever the clock reads as it is armed; an f
// already due runs at once in its own goroutine (clock.AfterFuncAt).
func (m *Manual) AfterFuncAt(t time.Time, f func()) Timer {
	defer m.jumpAsArmed()()
	return m.armAt(&manualTimer{m: m, f: f, index: -1}, t)
}

// JumpAsNextFuncArms has the next timed function armed (AfterFunc or
// AfterFuncAt) first move the clock forward by step, as Advance does,
// once: a test's move landing between the code's reading of the clock
// and its arming, the race a function armed for the time left as the
// clock was read loses. The channel returned is closed once the function
// is armed.
func (m *Manual) JumpAsNextFuncArms(step time.Duration) <-chan struct{} {
	m.jumpMu.Lock()
	defer m.jumpMu.Unlock()
	m.jump, m.jumped = step, make(chan struct{})
	return m.jumped
}

// jumpAsArmed moves the clock if a jump is set (JumpAsNextFuncArms) and
// returns what to do once the function is armed.
func (m *Manual) jumpAsArmed() func() {
	m.jumpMu.Lock()
	step, jumped := m.jump, m.jumped
	m.jump, m.jumped = 0, nil
	m.jumpMu.Unlock()
	if jumped == nil {
		return func() {}
	}
	m.Advance(step)
	return func() { close(jumped) }
}

// armAt arms a new timer for at, firing it at once if it is due.
func (m *Manual) armAt(t *manualTimer, at time.Time) Timer {
	m.mu.Lock()
	t.armAtLocked(at.UTC())
	f := m.fireIfDueLocked(t)
	m.mu.Unlock()
	if f != nil {
		go f()
	}
	return t
}

// AfterFunc arms f d from now. An f already due runs in its own goroutine,
// as with the time package (the caller may hold locks f needs); one that
// comes due later runs in the Advance or Set that makes it due.
func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	defer m.jumpAsArmed()()
	t := &manualTimer{m: m, f: f, index: -1}
	t.Reset(d)
	return t
}

// fireIfDueLocked fires t if it is due now and returns its function.
func (m *Manual) fireIfDueLocked(t *manualTimer) func() {
	if t.at.After(m.now) {
		return nil
	}
	heap.Remove(&m.timers, t.index)
	return t.fireLocked()
}

type manualTimer struct {
	m     *Manual
	at    time.Time
	seq   uint64
	c     chan time.Time
	f     func()
	index int // in m.timers; -1 when not pending
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

// armLocked schedules t d from now.
func (t *manualTimer) armLocked(d time.Duration) { t.armAtLocked(t.m.now.Add(d)) }

// armAtLocked schedules t for at.
func (t *manualTimer) armAtLocked(at time.Time) {
	m := t.m
	m.seq++
	t.at, t.seq = at, m.seq
	heap.Push(&m.timers, t)
	m.notifyLocked()
}

// fireLocked sends on the channel (a buffer of one, as the time package
// had, so the clock never blocks on a receiver) or returns the function to
// call. t is no longer pending.
func (t *manualTimer) fireLocked() func() {
	if t.f != nil {
		return t.f
	}
	select {
	case t.c <- t.m.now:
	default:
	}
	return nil
}

func (t *manualTimer) Stop() bool {
	m := t.m
	m.mu.Lock()
	defer m.mu.Unlock()
	return t.stopLocked()
}

// stopLocked removes t from the pending timers and drains a value it sent
// but nobody received, so none is received after Stop or Reset.
func (t *manualTimer) stopLocked() bool {
	m := t.m
	pending := t.index >= 0
	if pending {
		heap.Remove(&m.timers, t.index)
		m.notifyLocked()
	}
	if t.c != nil {
		select {
		case <-t.c:
		default:
		}
	}
	return pending
}

func (t *manualTimer) Reset(d time.Duration) bool {
	m := t.m
	m.mu.Lock()
	pending := t.stopLocked()
	t.armLocked(d)
	f := m.fireIfDueLocked(t)
	m.mu.Unlock()
	if f != nil {
		go f()
	}
	return pending
}

// manualHeap orders pending timers by deadline, then by arming order.
type manualHeap []*manualTimer

func (h manualHeap) Len() int { return len(h) }
func (h manualHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h manualHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *manualHeap) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *manualHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
