// Package rollout replaces the agents matching a selector in batches: the
// pure NextRollout, AdvanceRollout and DecideRollout decide (rollout.go),
// the Rollouts shell persists each step before the next
// (reconciler.go). Each batch is one termination of several subtree roots
// (supervisor.TerminateIn, written in the same transaction as the batch)
// and so one record; its job leases are left open (LeaseHandover) and
// reassigned, generation + 1, to ready replacements. It sits above the
// termination (package supervisor), which never imports it.
//
// Callers' duties:
//   - Run the reconciler (Rollouts.Run) for as long as the process leads,
//     beside the termination's; Start and Decide only persist.
//   - Give Rollouts the Supervisor whose terminations run the batches and,
//     to hand leases over, a supervisor.LeaseHandover (nil: leases stay
//     where they are and expire).
//   - Report readiness through tree.Tree.ReportReady: a replacement counts
//     only when it is running and ready.
package rollout
