// Package coordinator is the shell around the pure lease state machine
// (package lease): it owns every job's lease in memory, judges each message
// with lease.Step on the declared clock, makes the decision durable, and
// only then answers. It is the LeaseService's engine and the supervisor's
// LeaseCanceller.
//
// # Shards and the commit pipeline
//
// Jobs are spread over shards by a hash of the job id; each shard is one
// goroutine that alone reads and writes its jobs (docs/design.md §6: hot state
// has one owner). For every message, in order, a shard does what package
// lease's caller duties ask:
//
//  1. judge: now = the declared clock (never going backwards on a shard),
//     lease.Step against the job's latest judged lease (pending);
//  2. persist: the decision's evidence row — from which the lease after
//     the decision can be rebuilt — goes into the shard's building batch,
//     whatever the outcome (the audit log keeps rejected messages) — but a
//     former holder's message past its StaleRowsPerFormerHolder rows that
//     changes nothing, or the holder's once its generation ended, is
//     counted in the job's record instead (stalefold.go);
//  3. answer: only when that batch's commit returned.
//
// A shard does not wait for a commit before judging the next message: while
// one batch is being committed (at most one per shard, so a shard's writes
// reach the store in judgement order and an older lease can never overwrite
// a newer one), it keeps judging into the next batch, which is submitted the
// moment the commit returns — unless that commit answered several callers
// and fewer messages than them have come since: then the shard holds the
// next batch until they have, or for as long as the commit took (at most
// DefaultMaxHold; Config.Hold), so that callers in a closed loop go in one
// commit instead of splitting between batches that take turns. Batches grow with load, up to Config.MaxBatch,
// after which the shard stops reading its inbox until the commit returns.
// One committer per run makes the batches durable: every batch sealed while
// it was busy goes into its next store Update, so the shards share one
// commit rather than taking turns (taking turns, each commit carried only
// one shard's share of what was judged meanwhile). The store's group
// committer then shares that sync with everything else the control plane
// writes.
//
// If a commit fails, nothing in it happened: every job it or the following
// batch touched goes back to its durable lease, and their callers get
// ErrCommit.
//
// # Reads see only durable state
//
// Each job keeps two leases: pending (what the next message is judged
// against) and durable (what the last successful commit wrote). Get, List
// and every answer's lease are the durable one; Evidence reads the store.
// So nothing a reader sees can be lost to a crash: a reader may see a
// decision at the same moment as the caller's answer, never before it. The
// answer to a message carries the lease as it stood right after that
// message, and is sent only once that lease is durable.
//
// Get and List never answer a lease as if a deadline the declared clock
// has passed were still ahead: the shard runs its deadline sweep before
// the read, and answers a lease the sweep changed once that is durable.
//
// # Storage
//
// See keys.go for the layout. Every decision writes one evidence row; the
// job record is a checkpoint rewritten every checkpointEvery rows (and for
// every job on a clean stop), so a renewal costs one row, not a row and a
// record. The rows of one commit, of every job, go under one key of the
// evidence log (evidencelog.go), and every job's rows are folded from the
// log into a key of its own (a pack of consecutive rows) once per
// logWindow commits, in the commit that deletes the log key: on etcd a
// written key costs the member CPU whatever its size, so a renewal no
// longer writes a key of its own. Readers take a job's rows from its keys
// (a key of one row, as written before the log, or a pack) and then from
// the log, each row number once (jobRows); a pack never crosses an anchor
// row, so a page still finds the anchor it decodes from by its key. A row
// is a delta against the row before it (delta.go): the lease fields that
// changed, times relative to the decision, and the reason with its ids and
// timestamps as short references — about 100 bytes for a renewal instead
// of 350, which matters because Badger's synced commits cost by the entry
// and the byte. Loading a job reads its record and applies the rows after
// it in order (from its keys, then the log); Evidence applies a job's rows
// from the first, EvidencePage from the anchor row at or before its first
// row (every anchorEvery-th row of a job is written whole), so a page
// costs the same however long the history. A gap in a job's row numbers is
// reported as corruption. Rows about jobs that have no lease go to a
// bounded log (Config.UnknownLogSize) and stand alone. Records, rows and
// packs carry a schema version byte; a reader refuses a version it does
// not know (rows of schema 1, which held the whole lease, are still read),
// and a pack under one job's key that names another job.
//
// # Time
//
// The policy (lease.Policy) is declared and published (GetPolicy, `tether
// lease policy`). Each shard keeps a lease.DeadlineQueue of its jobs'
// next deadlines. Finding due deadlines (PopDue on the declared clock) and
// acting on them (a lease.Tick through the same judge-persist pipeline, with
// its own evidence row) are separate steps. A shard sleeps until its next
// deadline, at most Config.MaxWait, so a clock that jumps (a manual clock in
// tests) is noticed quickly. When lease.ReassignDue says so (policy
// AckMissReassign, a missed ACK, no ownership conflict, no cancel request,
// fewer than Policy.MaxAutoReassigns automatic reassignments in a row),
// the shard offers generation + 1 itself (lease.AutomaticReassign: for the
// lease's duration within the policy's maximum) to Config.PickHolder's
// choice, by default the same holder — once per judgement: one the lease
// machine refused is not followed by another — and only in the judgement
// that found the ACK missed. It first asks Config.HolderUnavailable about
// the holder: one being stopped, stopped, or whose exit was claimed or
// confirmed is not offered the next generation (lease.Reassign's
// HolderUnavailable withholds it, a REJECTED row saying why), and the job
// stays EXPIRED until its lineage reassigns or resolves it.
//
// # Runs, terms and restart
//
// Run is one run of the coordinator, and may be called again after it
// returned: with several control-plane replicas, each term of leadership
// is a run, on whichever replica leads. A run never trusts memory from an
// earlier one. It starts by fencing off every earlier run — of this
// coordinator or of another replica's (term.go): it increments the term
// counter (leases/term), and every shard commit checks, inside its
// transaction, that the counter still holds its term — then loads every
// lease from the store. A commit of an earlier run either happened before
// the increment, and the load sees it, or fails with ErrFenced and was
// never acknowledged; the fenced-off run stops serving (Serving reports
// false, messages fail with ErrStopped) until its Run returns. Messages
// sent before the first Run, or while a run starts, wait for it; messages
// sent between runs fail with ErrStopped, so callers retry against the
// replica that leads. Serving reports when a run serves and signals each
// change.
//
// Every commit also records the shard's latest decision time
// (leases/alive/<shard>), an idle shard does so every AliveInterval, and a
// clean stop records the stop time. A run's load reads every lease and the
// latest of those times (LastAlive); then, before serving, it applies the
// restart policy: lease.PlanRestart picks the OFFERED and ACTIVE leases
// (without a cancel request or a recorded ownership conflict, whose
// authority renewals could no longer extend) whose deadline fell after
// LastAlive — while no coordinator was
// deciding, so their holders could not renew — and, under the default
// policy (extend), each gets a Recover extending it to at least
// RestartGrace after the restart, spread over RestartSpread so they do not
// all expire at once. Deadlines that passed while a coordinator was still
// deciding (at LastAlive included: a lease has no authority at its
// deadline's instant) are not extended and expire on the first tick. An EXPIRED
// generation is never revived (lease.Step refuses it). Under RestartStrict
// nothing is extended. After a crash (or a leader cut off) LastAlive is
// the last commit (or alive record) before it, so leases whose deadline
// fell in the gap of at most AliveInterval are treated as if no
// coordinator had been deciding then. A change of leadership is exactly
// this restart. The declared clock does not go backwards across runs
// either: a run starts from LastAlive if its own clock is behind it, by at
// most the policy's skew allowance.
//
// # Caller duties
//
// Set Claim.HolderIdentity from the authenticated caller, never from the
// payload. Check authorisation before Apply; when it depends on the lease
// (the holder), pass a guard to ApplyIf so it is re-checked on the shard
// against the lease the message is judged with. A worker message must not
// be judged for a stranger to the job: the guard admits the parties
// (lease.Lease.Party: the holder, a string comparison, and the former
// holders) and refuses anyone else, who is then judged only if the caller
// is allowed to coordinate the job (a check the shell makes off the shard
// and re-asserts with a second guard). A guard's refusal judges nothing
// and writes no evidence row. Callbacks given to Submit
// run on a shard goroutine: they must not block and must not call back into
// the coordinator. Run must be running for anything to be answered; run it
// where the leases must live (with several replicas: on the leader only,
// once per term), and treat ErrStopped as "not here, not now": retry, or
// forward to the leader.
package coordinator
