// Package reconcile is the one reconcile loop every background worker of
// the control plane runs on: a keyed work queue that deduplicates, store
// watches that kick keys, a rescan of everything when a watch lagged or
// failed, and a wake-up time per key driven by the Clock's timers.
//
// It is level-triggered: a key carries no event, only "look at this".
// Reconcile reads the stored state of the key, does what is due, persists,
// and says when to look again. Lost kicks cost latency, never correctness,
// because every pass starts with a Scan of the stored state.
//
// The caller's duties:
//
//   - Reconcile is idempotent: it may run for a key any number of times,
//     after a crash, on another replica after a change of leader, or twice
//     for one change. It re-reads stored state, and persists each step
//     before taking the next.
//   - Reconcile returns the time to look again when the key waits for a
//     time (a deadline, a retry), computed from the loop's Clock; zero when
//     only a change can move it. A later return replaces the wake-up; an
//     error schedules a retry after Config.Retry (doubling to MaxRetry).
//   - Scan lists every key that may need work from stored state alone; it
//     is the recovery path after a restart and after a lagged watch.
//   - Changed kicks the keys a committed change may move. It must be cheap
//     and must not block (a watch that is not read falls behind and ends),
//     and it runs concurrently with Reconcile: what it keeps, it locks.
//     Kicking too much is harmless; kicking too little is a missed change
//     until the next rescan.
//   - Run runs once at a time per Loop (leader-only workers run it while
//     their replica leads); Kick may be called at any time, from anywhere.
//
// Run returns only when its context ends. A lagged watch is rescanned at
// once, any other failure of a pass after a backoff on the Clock (Passes,
// which workers with their own loop shape use too), so no background
// worker stops the server. Tests move a clock.Manual instead of poking the
// loop: its timers fire every wake-up that came due.
package reconcile
