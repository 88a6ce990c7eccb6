package clock

import (
	"context"
	"time"
)

// Clock tells the time and wakes its callers when a time comes.
type Clock interface {
	// Now is the current time, in UTC.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once d
	// has passed (at once when d <= 0).
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine once d has passed (Real), or
	// from the Advance or Set that makes it due (Manual). The returned
	// timer's C is nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a single pending wake-up. Stop and Reset follow the time
// package's semantics since Go 1.23: after either returns, no value sent
// before it is received from C.
type Timer interface {
	// C receives the time when the timer fires (nil for AfterFunc).
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped a
	// pending timer.
	Stop() bool
	// Reset makes the timer fire d from now; it reports whether the timer
	// was pending.
	Reset(d time.Duration) bool
}

// Sleep waits until d has passed on c, or ctx ends (then it returns the
// context's error). A d of zero or less returns at once, with the
// context's error if it has ended.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// Until is the time left on c before t (negative when t has passed).
func Until(c Clock, t time.Time) time.Duration { return t.Sub(c.Now()) }

// NewTimerAt returns a timer of c that fires once c reads t (at once when
// it already does). A clock that can arm a timer for a moment, not only a
// duration (Manual), does so: NewTimer(Until(c, t)) reads the clock, then
// arms from what it reads when arming, so a test's clock moved between the
// two armed it late by the move — a worker waiting for a wake-up at 11 s
// armed at 15 s because the test set the clock to 11 s less a millisecond
// meanwhile, and never woke at 11 s.
func NewTimerAt(c Clock, t time.Time) Timer {
	if a, ok := c.(interface{ NewTimerAt(time.Time) Timer }); ok {
		return a.NewTimerAt(t)
	}
	return c.NewTimer(Until(c, t))
}

// AfterFuncAt calls f once c reads t (in its own goroutine at once when it
// already does), as NewTimerAt arms a timer: for the moment itself on a
// clock that can (Manual), not for the time left as the caller read the
// clock — a refusal's trailing report, armed for the end of its interval
// from a reading the test's Advance overtook, came due an Advance late.
func AfterFuncAt(c Clock, t time.Time, f func()) Timer {
	if a, ok := c.(interface {
		AfterFuncAt(time.Time, func()) Timer
	}); ok {
		return a.AfterFuncAt(t, f)
	}
	return c.AfterFunc(Until(c, t), f)
}

// Real is the wall clock, in UTC; its timers are the time package's.
type Real struct{}

// Now returns the current wall-clock time in UTC.
func (Real) Now() time.Time { return time.Now().UTC() }

// NewTimer returns a time.Timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// AfterFunc returns a time.AfterFunc timer.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
