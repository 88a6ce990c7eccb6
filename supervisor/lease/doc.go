// Package lease is the job-lease protocol as a pure state machine: delivery
// is not ownership.
//
// A job's Lease records who may execute it (HolderIdentity), for which
// generation (Generation, a fencing token that only increases, with a new
// LeaseID each time) and until when (ExpiresAt, on the coordinator's
// clock). Everything that happens to a lease goes through one function:
//
//	Step(lease, message, now, policy) -> (lease', decision, events)
//
// Step does no I/O, reads no clock and starts no goroutine; the same inputs
// always give the same outputs, which is what makes the evidence matrix
// reproducible and lets transcript tests replay whole scenarios
// (testdata/*.txt).
//
// # The lifecycle
//
// An Offer is only a delivery (OFFERED). The holder's Ack before the ACK
// deadline moves it OFFERED -> ACKED -> ACTIVE with ExpiresAt = ack time +
// LeaseDuration; an ACK is acceptance, never completion. A missed ACK
// expires the generation; Policy.AckMiss says whether the coordinator then
// reassigns automatically (see ReassignDue). Renew extends ExpiresAt to
// now + LeaseDuration when it comes from the current generation's holder,
// before expiry, with a RenewSequence above the accepted one. Progress is
// evidence bound to the active generation with a monotonic sequence; it
// never renews. Expiry is the authority boundary: once ExpiresAt passes, the
// generation is EXPIRED whether or not a Tick ran, and nothing revives it —
// the job continues only as a new generation (Reassign) or ends (Resolve).
// A terminal result (Complete: SUCCESS, FAILED, CANCELLED) is accepted only
// from the active generation's holder within its lease.
//
// Cancellation is two facts, neither of which ends the job: RequestCancel
// (the coordinator's intent) and CancelAck (the worker's acknowledgement).
// The holder's Complete(CANCELLED) acknowledges the request too, so the
// record does not depend on which of the two a reordering transport
// delivered first (a CancelAck after it is a DUPLICATE). Likewise a
// CancelAck after the holder's own FAILED is recorded while its lease
// still runs; after a result the coordinator resolved
// (Lease.ResolvedByCoordinator), the job was closed without it, and it is
// refused.
// After a cancel request, authority is no longer extended (renews are
// refused, and a restart gives it no grace, so it ends at ExpiresAt at the
// latest), progress is recorded as
// LATE_PROGRESS evidence instead of advancing the record, and SUCCESS is
// refused: the coordinator asked the work to stop, and a success claimed
// afterwards is not trusted. The job ends with the holder's
// Complete(CANCELLED or FAILED) or the coordinator's Resolve (CANCELLED,
// FAILED, or UNRESOLVED for a bounded time, after which it is FAILED) —
// or, when the generation's authority ends (its expiry, a missed ACK)
// with the request standing, by the clock: nothing is then left to decide
// but how the job ended, and it is closed UNRESOLVED, the coordinator's
// (ResolvedByCoordinator), bounded by Policy.MaxUnresolvedBound, so a
// holder that never answers cannot keep the job open (CancelLapsed).
// CANCELLED, whoever reports it, needs the cancel request first: a job
// nobody asked to stop was not cancelled, and the evidence must show the
// request. A terminal attempt after the end is a DUPLICATE only when it
// repeats the recorded result and detail exactly; other words are refused.
//
// A second identity claiming the active generation under its lease id is an
// ownership conflict, and it halts optimistic execution: the flag is kept
// (a healthy renew or heartbeat from the real holder does not clear it),
// renewals are refused and a restart gives it no grace, so authority is no
// longer extended and ends at ExpiresAt at the latest, progress is not applied, completion is refused,
// Authority reports no holder, and automatic reassignment stops — until
// the coordinator settles it with Reassign{ResolveConflict: true} (a new
// generation, possibly to the same holder) or a final Resolve.
//
// The coordinator's decisions (RequestCancel, Reassign, Resolve) may name
// the generation they were made about (Generation): one naming a generation
// since replaced — delayed, or retried after it was applied — is REJECTED
// STALE_GENERATION and changes nothing, so a late "resolve FAILED" never
// ends the generation that replaced the one it was about, and a retried
// reassignment never issues another. Naming none, a decision is about
// whichever generation is current when it is judged.
//
// Who may reach Step at all is the shell's decision (see Caller duties):
// Lease.Owner records who offered the job and Lease.FormerHolders who held
// it before, so the shell can refuse a stranger's message before it is
// judged — a stranger must never be able to record a conflict, read the
// lease through a rejection's reason, or write an evidence row.
//
// Every message gets a Decision — ACCEPTED, DUPLICATE or REJECTED, an
// AuditEvent and a human-readable reason — stale, late and duplicate ones
// included. A duplicate of something already applied changes nothing.
//
// # Reordered delivery
//
// Each message is judged on its own identity, generation, sequence and
// coordinator receipt time (the now it is stepped with), never on arrival
// order. Precisely: take one generation's worker history — renews with
// increasing sequences, each received once, and progress with increasing
// sequences, possibly received more than once — whose receipt times all
// fall before the expiry the lease had when the history began. Stepping
// those messages in any order, each at its own receipt time, yields the
// same:
//
//   - owner: State, Generation, LeaseID, HolderIdentity;
//   - renewal: RenewSequence (the highest), RenewTime (its receipt time)
//     and ExpiresAt (RenewTime + LeaseDuration) — a renew overtaken by a
//     higher one is STALE_RENEW, so expiry follows the newest renew, not
//     the last to arrive;
//   - progress: ProgressSequence (the highest) and its ProgressValue.
//
// What may differ is audit: which messages were answered DUPLICATE,
// STALE_RENEW or LATE_PROGRESS, and the LateProgress flag. If the history
// ends with a terminal result, the owner and the result are still
// order-independent, but renews and progress overtaken by the result are
// late evidence. On a live clock (receipt times increase in processing
// order) the same holds for owner and sequences, and ExpiresAt is always
// one LeaseDuration after the receipt of the highest renew sequence.
//
// # Caller duties
//
// The shell (the goroutine that owns a shard of leases) must, for every
// message, in this order:
//
//  1. Judge: authenticate the caller and set Claim.HolderIdentity from the
//     credential; refuse a worker message from anyone who is neither a
//     party to the job (Lease.Party: the holder or a former holder) nor
//     allowed to coordinate it, without calling Step and without a row;
//     take now from the declared clock (Policy.ClockSource) when the
//     message is received, load the job's lease, and call Step.
//  2. Persist: write the returned lease and its EvidenceRow (NewEvidenceRow)
//     in one transaction, whatever the outcome — a rejection's row is the
//     audit of that rejection. Rows for a job without a lease (UNKNOWN_LEASE)
//     have no job record to join; keep them in a bounded log.
//  3. Answer: only after the commit, reply with the decision and the lease
//     (Decision.Err maps a rejection to a sentinel error for status codes);
//     to a former holder, with ForFormerHolder's view of them, which names
//     nothing of the generation that replaced its own.
//
// Then keep time moving: DeadlineQueue.Sync the lease after each Step, and
// step a Tick for every job DeadlineQueue.PopDue returns; when ReassignDue
// reports true at the judgement that found the ACK missed, pick a holder
// and step AutomaticReassign's message, once (a refused one leaves the job
// due, and is not stepped again then), with HolderUnavailable saying why
// the holder cannot take work if it cannot (being stopped, stopped, its
// exit claimed or confirmed): the reassignment is then withheld and the
// job stays EXPIRED, as the ack-miss policy expire leaves it. After a
// restart, step the Recover messages from PlanRestart before serving.
//
// # Mapping to tether.v1
//
// State, AckState, TerminalResult, Outcome and AuditEvent have the numeric
// values of the proto enums LeaseState, AckState, TerminalResult, Outcome
// and AuditEvent, and String returns the proto name without its prefix.
// Lease and EvidenceRow fields carry the proto field names in Go form
// (Generation is lease_generation, Transitions is lease_transitions). This
// package does not import the generated code.
package lease
