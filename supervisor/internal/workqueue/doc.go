// Package workqueue is the queue of the supervisor's reconcilers (the
// termination's and the rollout's): keys to reconcile now, each at most
// once at a time, and timers to reconcile one again later. The caller owns
// the clock and the wait: it promotes the due timers with its clock's now,
// takes and reconciles the ready keys, marks each Done, and waits on
// Signal or the next due time.
package workqueue
