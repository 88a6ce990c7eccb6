// Package crash is Tether's crash harness: it runs the real `tether serve`
// binary, drives a mixed workload at it from many concurrent clients, kills
// it with SIGKILL at seeded random points, restarts it on the same data
// directory and checks, after every restart, what the control plane promised
// before the kill (docs/reliability.md):
//
//   - every acknowledged write is present: nodes, grants, revocations,
//     terminations, lease decisions;
//   - no termination is stuck (each reaches terminated after the restart)
//     and none has two reconciliation records;
//   - the history of lease operations — requests and answers, with the
//     calls the kill cut off recorded as "no answer" — is linearizable
//     against a sequential model of the lease state machine (LeaseModel,
//     checked with porcupine, partitioned by job).
//
// The harness itself is TestCrash in crash_test.go. `make test` runs it
// with 3 kills; `make test-crash` with TETHER_CRASH_KILLS=50 (or more).
// TETHER_CRASH_SEED fixes the seed that chooses the workload and the kill
// points; the test logs the seed it used.
//
// LeaseModel is written from the protocol's rules (docs/design.md §1, the
// job-lease seed), not from the coordinator's code: what each message does
// to a job's authority — generation, holder, lease id, state, renew and
// progress sequences, cancel request and ack, terminal result, ownership
// conflict — and which outcome (ACCEPTED, DUPLICATE, REJECTED) it gets.
// Time is not modelled: the harness uses lease durations far longer than
// the test, and an answer that shows the coordinator's clock expired a
// generation moves the model to EXPIRED, from which that generation never
// returns.
package crash
