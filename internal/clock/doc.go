// Package clock is the injected source of time. State machines never read
// the clock; the shells around them take a Clock, pass `now` in, and wait
// on the Clock's timers — never on the time package's — wherever a wait
// decides behaviour (a deadline, a retry, a periodic re-evaluation).
//
// Real is the wall clock. Manual is moved by its owner (a test): Advance
// and Set fire, before they return and in deadline order, every timer that
// came due, so a test moves time instead of poking the workers that wait
// on it. A worker computes its deadlines from Now and arms its timer for
// the deadline itself (NewTimerAt, AfterFuncAt), not for what it read was
// left (Until): a test's move between the reading and the arming armed
// the latter late by the move, where the former, come due meanwhile, fires
// at once, so there is no race to lose. A duration (a retry's backoff, a
// bound on a wait) is armed with NewTimer or AfterFunc. BlockUntil lets a
// test wait until a worker has armed its wake-up.
//
// The caller's duties: stop every timer it no longer waits on (a pending
// timer is kept by the clock); do not call Advance or Set while holding a
// lock an AfterFunc function takes (the function runs inside them).
package clock
