package coordinator

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease"
)

// Sentinel errors.
var (
	// ErrNotFound: the job has no lease (GetLease, Evidence).
	ErrNotFound = fault.New(fault.NotFound, "coordinator: no lease for the job")
	// ErrStopped: the coordinator is not serving — it is shutting down,
	// between two runs (this replica lost the lead), or was fenced off by
	// a newer run (ErrFenced) — so the message was not judged. Retry: the
	// replica that leads answers.
	ErrStopped = fault.New(fault.Unavailable, "coordinator: not serving")
	// ErrCommit: the decision could not be made durable, so it was not
	// made: the lease is as it was before the message.
	ErrCommit = fault.New(fault.Unavailable, "coordinator: commit failed")
	// ErrPrecondition: a guard refused the message because the lease
	// changed between the caller's check and the judgement (for example a
	// concurrent reassignment changed the holder); nothing was judged.
	ErrPrecondition = fault.New(fault.Conflict, "coordinator: lease changed")
	// ErrInvalidArgument: a malformed request; nothing was judged.
	ErrInvalidArgument = fault.New(fault.Invalid, "coordinator: invalid argument")
)

// Config configures a Coordinator.
type Config struct {
	Store store.Store
	// Clock is the declared clock (Policy.ClockSource): every decision's
	// now comes from it, read by the shard when it judges the message.
	Clock  clock.Clock
	Policy lease.Policy
	Log    *slog.Logger
	// Shards is how many goroutines own leases; 0 means GOMAXPROCS, at
	// least 2. A job always lives on the same shard (hash of the job id).
	Shards int
	// MaxBatch caps how many messages one shard commit carries; 0 means
	// 4096. While a commit is in flight the shard keeps judging until the
	// next batch is full, then waits.
	MaxBatch int
	// MaxCommitBytes caps what one batch, and one commit of several,
	// writes of evidence rows and lease records (roughly as the store
	// counts them); 0 means DefaultMaxCommitBytes. A shard seals its batch
	// once it passes the cap and judges on into the next, so that no
	// number of jobs judged at once (a termination's cancels, a clean
	// stop's checkpoints) makes a transaction larger than the store takes.
	MaxCommitBytes int
	// MaxWait bounds how long a shard sleeps before looking at the clock
	// again for due deadlines; 0 means 100ms. With the real clock a shard
	// wakes at the next deadline anyway; the bound matters for clocks that
	// jump (a manual clock in tests, a stepped wall clock).
	MaxWait time.Duration
	// AliveInterval is how often an idle shard records that it is alive
	// (restart planning uses the last record); 0 means 5s of clock time.
	// Every commit records it too.
	AliveInterval time.Duration
	// Hold bounds how long a shard holds its next commit, once a commit
	// came back, for the callers that commit answered to send their next
	// messages (a closed-loop renewer sends its next renew as soon as it
	// is answered): it commits when as many messages as it answered have
	// come, or at the bound. 0 means the last commit's time, at most
	// DefaultMaxHold; a negative Hold, never.
	Hold time.Duration
	// PickHolder chooses the holder of an automatic reassignment (policy
	// AckMissReassign). Nil offers generation + 1 to the same holder.
	PickHolder func(l lease.Lease) string
	// HolderUnavailable says why the holder PickHolder chose cannot take
	// work ("" when it can): its node is being stopped or is stopped, or
	// its exit was claimed or confirmed. The automatic reassignment is then
	// withheld (lease.Reassign.HolderUnavailable, a REJECTED row saying
	// why) and the job stays EXPIRED, as the ack-miss policy expire leaves
	// it, until the coordinating lineage reassigns or resolves it. It runs
	// on a shard, at a missed ACK under AckMissReassign (never for
	// another message), once per holder per batch, so it must answer
	// quickly; an error reading the
	// holder should answer unavailable (safety over the job's liveness).
	// Nil: every holder can take work.
	HolderUnavailable func(ctx context.Context, holder string) string
	// NewLeaseID makes the lease id of a new generation; nil means
	// id.New(id.Lease).
	NewLeaseID func() string
	// UnknownLogSize bounds the log of rows about jobs without a lease; 0
	// means 10000.
	UnknownLogSize int
	// MaxOpenPerHolder and MaxOpenPerAccount bound the open (not
	// terminal) leases one holder, and the holders of one account (the
	// caller's name for a holder's lineage), may hold: an offer or
	// reassignment through ApplyBounded past either is refused ErrLimit,
	// unjudged (through ApplyHolderBounded, past the first only). 0: no
	// bound. Terminal leases are not counted.
	MaxOpenPerHolder, MaxOpenPerAccount int
	// OpenReservePerHolder is each holder's own share beside its
	// account's: the account's bound counts only the open leases each
	// holder holds past it, so a holder can be offered this many (within
	// MaxOpenPerHolder) however full its account is, and one holder that
	// filled its account cannot keep its siblings from theirs. An account
	// of N holders so holds at most MaxOpenPerAccount +
	// N·OpenReservePerHolder open leases. 0: none.
	OpenReservePerHolder int
	// Accounts names the account of each of holders (those of open
	// leases a run's load found, whose accounts no bounded message named
	// since this coordinator was made); nil: none is counted under an
	// account until a bounded message names it. Called before the run
	// serves, never on a shard.
	Accounts func(ctx context.Context, holders []string) (map[string]string, error)
}

func (c *Config) defaults() error {
	if c.Store == nil {
		return errors.New("coordinator: a store is required")
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Shards <= 0 {
		c.Shards = max(2, runtime.GOMAXPROCS(0))
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 4096
	}
	if c.MaxCommitBytes <= 0 {
		c.MaxCommitBytes = DefaultMaxCommitBytes
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 100 * time.Millisecond
	}
	if c.AliveInterval <= 0 {
		c.AliveInterval = 5 * time.Second
	}
	if c.PickHolder == nil {
		c.PickHolder = func(l lease.Lease) string { return l.HolderIdentity }
	}
	if c.NewLeaseID == nil {
		c.NewLeaseID = func() string { return id.New(id.Lease) }
	}
	if c.UnknownLogSize <= 0 {
		c.UnknownLogSize = 10000
	}
	return c.Policy.Validate()
}

// DefaultMaxHold bounds the hold of Config.Hold 0: longer than a commit
// on a local disk or a nearby etcd quorum takes, and short enough that a
// caller that does not come back costs others little.
const DefaultMaxHold = 2 * time.Millisecond

// DefaultMaxCommitBytes is Config.MaxCommitBytes when it is zero. A
// commit writes its batches' rows and records, the evidence log's key of
// those rows, and the packs of the log's oldest commit it folds (at most
// about as much again, evidencelog.go): with Badger's smallest memtable
// the store allows (8 MiB, whose transactions take some 1.2 MB) that
// stays inside, and far inside the default's (64 MiB, some 9.6 MB) and
// etcd's request bound (16 MiB).
const DefaultMaxCommitBytes = 128 << 10

// Coordinator owns every job lease. See the package documentation.
type Coordinator struct {
	cfg    Config
	shards []*shard
	seed   maphash.Seed
	// countReads counts what CountHeldBy's shards read to answer: a
	// stop rule asks on every evaluation of a node.
	countReads atomic.Int64
	// listCopies counts what the shards copied into their answers to a
	// listing (List, ListHeldBy: leases; a termination's heldBy: job
	// ids), a page of them being all an answer needs.
	listCopies atomic.Int64
	// listWalks counts the jobs the shards visited to answer a page of
	// a holder's listing (List and ListHeldBy of holders, a termination's
	// heldBy), those before the page's start included.
	listWalks atomic.Int64

	// door guards handing ops to the shards against the end of a run:
	// senders hold it shared, Run takes it exclusively to stop serving, so
	// no message is left in an inbox nobody reads.
	door  sync.RWMutex
	phase atomic.Int32 // a runPhase; changed under door (exclusively when it stops serving)
	// deposed: a commit of this run found a newer term (ErrFenced); the
	// run answers nothing more until it ends.
	deposed atomic.Bool

	// stateMu guards running, changed and lastAlive.
	stateMu sync.Mutex
	running bool
	changed chan struct{} // closed when Serving's answer changes
	// lastAlive is when the previous run was last known to be deciding,
	// read by the current (or last) run's load; zero on a first start.
	lastAlive time.Time
	term      atomic.Uint64

	// unknownSeq numbers rows of the unknown-job log; every shard may
	// write one.
	unknownMu  sync.Mutex
	unknownSeq uint64

	// open counts the open leases by holder and account (bound.go).
	open *openCounts

	commits, judged, commitNanos atomic.Uint64
	// decided counts durable decisions by outcome and audit event
	// (decisions.go).
	decided [tallyOutcomes * tallyEvents]atomic.Uint64
	// commitQueue is the current run's queue of sealed batches (tests
	// look at its length).
	commitQueue chan *batch
	// evlog is the evidence log as the run's committer knows it
	// (evidencelog.go): set by the run's load, then the committer's.
	evlog evidenceLog
}

// runPhase is where the coordinator is between and within runs.
type runPhase int32

const (
	// phaseIdle: before the first Run. Messages wait in the inboxes for it.
	phaseIdle runPhase = iota
	// phaseStarting: Run is fencing off earlier runs and loading the
	// leases. Messages wait for it.
	phaseStarting
	// phaseServing: the shards judge, persist and answer.
	phaseServing
	// phaseStopped: a run ended (or failed to start); messages fail with
	// ErrStopped until the next Run starts.
	phaseStopped
)

// Stats are counters for monitoring and benchmarks.
type Stats struct {
	// Commits is how many store Updates made shard batches durable (the
	// batches that wait together share one); Judged how many messages
	// they carried (ticks and recoveries included).
	Commits, Judged uint64
	// CommitTime is the total time those Updates took.
	CommitTime time.Duration
}

// Stats returns the counters so far.
func (c *Coordinator) Stats() Stats {
	return Stats{Commits: c.commits.Load(), Judged: c.judged.Load(), CommitTime: time.Duration(c.commitNanos.Load())}
}

// Result is the answer to one message: the decision and the lease as it
// stands after it (durable: the commit has happened), and the number of the
// evidence row that records it (0 for a job without a lease, whose rows go
// to the bounded unknown-job log).
type Result struct {
	Lease    lease.Lease
	Decision lease.Decision
	Row      uint64
}

// New validates the configuration. It does not read the store: each Run
// loads the leases, after fencing off every earlier run (term.go).
// Messages sent before the first Run wait for it (up to an inbox's
// capacity per shard); messages sent between runs fail with ErrStopped.
func New(_ context.Context, cfg Config) (*Coordinator, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := &Coordinator{cfg: cfg, seed: maphash.MakeSeed(), changed: make(chan struct{}), open: newOpenCounts(cfg.OpenReservePerHolder)}
	for i := range cfg.Shards {
		c.shards = append(c.shards, newShard(c, i))
	}
	return c, nil
}

// load reads every lease, the latest alive time and the unknown-job log
// into fresh shard state for a run holding term.
func (c *Coordinator) load(ctx context.Context, term uint64) (lastAlive time.Time, err error) {
	for _, s := range c.shards {
		s.reset(term)
	}
	var unknownSeq uint64
	err = c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		// A retried View starts from scratch.
		for _, s := range c.shards {
			s.reset(term)
		}
		lastAlive, unknownSeq = time.Time{}, 0
		var err error
		if c.evlog, err = loadLog(tx); err != nil {
			return err
		}
		logRows := make(map[string][]logRow)
		for _, commit := range c.evlog.window {
			for _, r := range commit.rows {
				logRows[r.job] = append(logRows[r.job], r)
			}
		}
		var checkpoints []record
		err = tx.Scan([]byte(prefixJob), nil, func(key, value []byte) error {
			if isLayoutKey(key) {
				return nil
			}
			r, err := decodeRecord(value)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			checkpoints = append(checkpoints, r)
			return nil
		})
		if err != nil {
			return err
		}
		for start := 0; start < len(checkpoints); start += loadChunk {
			chunk := checkpoints[start:min(start+loadChunk, len(checkpoints))]
			// On etcd each catch-up scan would be a round trip of its own:
			// fetch the chunk's first pages together.
			scans := make([]store.ScanFrom, len(chunk))
			for i, r := range chunk {
				scans[i] = store.ScanFrom{Prefix: evidencePrefix(r.Lease.JobID), Start: evidenceKey(r.Lease.JobID, anchorBefore(r.Rows+1))}
			}
			if err := store.PrefetchScansFrom(tx, scans); err != nil {
				return err
			}
			for _, r := range chunk {
				checkpoint := r.Rows
				if err := catchUp(tx, &r, logRows[r.Lease.JobID]); err != nil {
					return err
				}
				c.shardOf(r.Lease.JobID).load(r, checkpoint)
			}
		}
		err = tx.Scan([]byte(prefixAlive), nil, func(key, value []byte) error {
			d := decoder{b: value}
			t := d.time()
			if err := d.done(); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if t.After(lastAlive) {
				lastAlive = t
			}
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Scan([]byte(prefixUnknown), nil, func(key, value []byte) error {
			r, err := decodeRow(lease.Lease{}, value)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			unknownSeq = max(unknownSeq, r.Number)
			return nil
		})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("coordinator: load leases: %w", err)
	}
	c.unknownMu.Lock()
	c.unknownSeq = unknownSeq
	c.unknownMu.Unlock()
	return lastAlive, nil
}

// loadChunk is how many jobs' rows a load fetches ahead at a time (on
// etcd, in requests of a few hundred scans each).
const loadChunk = 4096

// catchUp brings a job record read from the store to the job's newest
// state: the record is a checkpoint, and the evidence rows written after
// it carry the lease too (log: the job's rows in the evidence log).
func catchUp(tx store.ReadTxn, r *record, log []logRow) error {
	job := r.Lease.JobID
	rows := rowReader{prev: r.Lease, number: r.Rows}
	return jobRows(tx, job, r.Rows+1, log, func(_ uint64, key, value []byte) error {
		row, err := rows.next(value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if row.Number > r.Rows {
			r.Lease, r.Rows = row.Lease, row.Number
		}
		return nil
	})
}

// StoredLease reads the job's durable lease from the store (its record and
// the evidence rows after it), on any replica, whether or not a run serves
// here: what Get answers where no run serves. The read is one consistent
// snapshot, and on etcd its first read is linearizable, so it sees every
// decision acknowledged before it began, by whichever replica led — the
// same promise as Get on the leader (never less than an answer implies,
// nothing that can be lost). It may also see a decision made durable whose
// answer is still on its way to the caller.
func (c *Coordinator) StoredLease(ctx context.Context, job string) (lease.Lease, error) {
	if jobKeyIsReserved(job) {
		return lease.Lease{}, fmt.Errorf("%w: job %q", ErrNotFound, job)
	}
	var r record
	err := c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		r = record{}
		b, err := tx.Get(jobKey(job))
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if r, err = decodeRecord(b); err != nil {
			return fmt.Errorf("%s: %w", jobKey(job), err)
		}
		if r.Lease.JobID != job {
			return fmt.Errorf("%w: the record of job %q names job %q", ErrCorrupt, job, r.Lease.JobID)
		}
		log, err := readLog(tx, job)
		if err != nil {
			return err
		}
		return catchUp(tx, &r, log)
	})
	if err != nil {
		return lease.Lease{}, err
	}
	if !r.Lease.Exists() {
		return lease.Lease{}, fmt.Errorf("%w: job %q", ErrNotFound, job)
	}
	return r.Lease, nil
}

// Policy returns the declared time policy.
func (c *Coordinator) Policy() lease.Policy { return c.cfg.Policy }

// LastAlive is when the run before the current (or last) one was last
// known to be deciding, as that run's load found it (zero on a first start
// and before the first load): restart planning extends only deadlines
// after it.
func (c *Coordinator) LastAlive() time.Time {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.lastAlive
}

// Term is the current (or last) run's term: 0 before the first run has
// fenced, then growing by one for every run of any coordinator on the
// store.
func (c *Coordinator) Term() uint64 { return c.term.Load() }

// Serving reports whether a run serves — it fenced off every earlier run,
// loaded every lease, and was not fenced off since — and returns a channel
// closed at the next change of that answer.
func (c *Coordinator) Serving() (serving bool, changed <-chan struct{}) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return runPhase(c.phase.Load()) == phaseServing && !c.deposed.Load(), c.changed
}

// notify wakes whoever waits on Serving's channel.
func (c *Coordinator) notify() {
	c.stateMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.stateMu.Unlock()
}

// depose stops a run that found a newer term: it answers nothing more,
// and its caller (the leader election) is about to end it anyway.
func (c *Coordinator) depose(cause error) {
	if c.deposed.Swap(true) {
		return
	}
	c.cfg.Log.Error("lease coordinator fenced off: a newer run took the leases over; not serving until this run ends", "term", c.term.Load(), "cause", cause)
	c.notify()
}

func (c *Coordinator) shardOf(job string) *shard {
	return c.shards[maphash.String(c.seed, job)%uint64(len(c.shards))]
}

// startBackoffMax bounds the wait between attempts to start a run when
// the store fails (etcd unreachable for a moment).
const startBackoffMax = 5 * time.Second

// Run serves until ctx ends: one run (with several replicas, one term of
// leadership). It may be called again after it returned; each call is a
// restart. It fences off every earlier run (term.go) and loads every lease
// from the store, retrying while the store fails (but not on a corrupt
// record); then it applies the restart policy (PlanRestart, then one
// Recover per planned lease), judges messages, acts on deadlines as the
// clock reaches them, and on the way out commits what it judged and
// records a clean stop. It returns nil when ctx ends.
func (c *Coordinator) Run(ctx context.Context) error {
	c.stateMu.Lock()
	if c.running {
		c.stateMu.Unlock()
		return errors.New("coordinator: Run is already running")
	}
	c.running = true
	c.stateMu.Unlock()
	defer func() {
		c.stateMu.Lock()
		c.running = false
		c.stateMu.Unlock()
	}()

	c.door.Lock()
	c.phase.Store(int32(phaseStarting))
	c.door.Unlock()
	lastAlive, err := c.start(ctx)
	if err != nil {
		c.stopServing(fmt.Errorf("%w: %w", ErrStopped, err))
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	// The declared clock never goes backwards across runs either, within
	// the skew the policy allows between replicas' clocks: a replica
	// taking over from one whose clock ran slightly ahead continues from
	// the latest decision time instead of judging "before" it.
	now := c.cfg.Clock.Now().Round(0)
	if ahead := lastAlive.Sub(now); ahead > 0 {
		if ahead > c.cfg.Policy.SkewAllowance {
			c.cfg.Log.Warn("the previous lease coordinator's clock ran ahead of this one by more than the skew allowance; check the replicas' clocks",
				"ahead", ahead, "skew_allowance", c.cfg.Policy.SkewAllowance)
			ahead = c.cfg.Policy.SkewAllowance
		}
		now = now.Add(ahead)
	}
	for _, s := range c.shards {
		s.lastNow = now
	}
	var plan []lease.Recover
	if !lastAlive.IsZero() {
		var all []lease.Lease
		for _, s := range c.shards {
			for _, e := range s.leases {
				all = append(all, e.durable)
			}
		}
		plan = lease.PlanRestart(all, lastAlive, now, c.cfg.Policy)
		if len(plan) > 0 {
			c.cfg.Log.Info("lease restart plan: extending deadlines that fell while no coordinator was serving",
				"leases", len(plan), "last_alive", lastAlive, "restart_at", now, "policy", c.cfg.Policy.Restart.String())
		}
	}
	for _, r := range plan {
		s := c.shardOf(r.JobID)
		s.recover = append(s.recover, r)
	}

	stopping := make(chan struct{})
	// A shard has at most one batch in flight and one waiting, so the
	// queue never blocks a shard.
	commits := make(chan *batch, 2*len(c.shards))
	c.commitQueue = commits
	replies := newReplies()
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		c.commitLoop(commits, replies)
	}()
	defer func() {
		close(commits)
		<-committed
	}()
	var wg sync.WaitGroup
	c.deposed.Store(false)
	for _, s := range c.shards {
		// What a shard asks outside itself (Config.HolderUnavailable) it
		// asks under the run's values, past the run's end too: a shard
		// finishing what got in still judges it as it would have.
		s.ctx = context.WithoutCancel(ctx)
		wg.Go(func() { s.run(stopping, commits, replies) })
	}
	c.phase.Store(int32(phaseServing))
	c.notify()
	<-ctx.Done()
	// Close the door, then let the shards finish what got in.
	c.door.Lock()
	c.phase.Store(int32(phaseStopped))
	c.door.Unlock()
	c.notify()
	close(stopping)
	wg.Wait()
	return nil
}

// start fences off earlier runs and loads the leases, retrying with a
// growing backoff while the store fails; a corrupt record fails at once.
func (c *Coordinator) start(ctx context.Context) (lastAlive time.Time, err error) {
	backoff := 50 * time.Millisecond
	for {
		lastAlive, err = c.startOnce(ctx)
		if err == nil || errors.Is(err, ErrCorrupt) || ctx.Err() != nil {
			return lastAlive, err
		}
		c.cfg.Log.Warn("lease coordinator could not start; retrying", "error", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return time.Time{}, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, startBackoffMax)
	}
}

func (c *Coordinator) startOnce(ctx context.Context) (time.Time, error) {
	var term uint64
	err := c.cfg.Store.Update(ctx, func(tx store.Txn) error {
		var err error
		term, err = startTerm(tx)
		if err != nil {
			return err
		}
		if err := tx.Put(layoutKey, []byte{layoutMarker}); err != nil {
			return err
		}
		return tx.Put(holdingsLayoutKey, []byte{layoutMarker})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("coordinator: start a term: %w", err)
	}
	c.term.Store(term)
	lastAlive, err := c.load(ctx, term)
	if err != nil {
		return time.Time{}, err
	}
	if err := c.countOpen(ctx); err != nil {
		return time.Time{}, err
	}
	c.stateMu.Lock()
	c.lastAlive = lastAlive
	c.stateMu.Unlock()
	c.cfg.Log.Info("lease coordinator serving", "term", term, "last_alive", lastAlive)
	return lastAlive, nil
}

// stopServing ends a run that could not start: what waits in the inboxes
// fails with err, and so does everything sent until the next Run.
func (c *Coordinator) stopServing(err error) {
	c.door.Lock()
	c.phase.Store(int32(phaseStopped))
	c.door.Unlock()
	c.notify()
	for _, s := range c.shards {
		for len(s.inbox) > 0 {
			(<-s.inbox).fail(err)
		}
	}
}

// send hands op to its shard, or fails it when no run serves. While a run
// is starting (or before the first) it waits in the inbox, which does not
// block the sender: nobody reads the inbox yet.
func (c *Coordinator) send(s *shard, o op) {
	c.door.RLock()
	defer c.door.RUnlock()
	switch runPhase(c.phase.Load()) {
	case phaseServing:
		if c.deposed.Load() {
			o.fail(fmt.Errorf("%w: %w", ErrStopped, ErrFenced))
			return
		}
		s.inbox <- o
	case phaseIdle, phaseStarting:
		select {
		case s.inbox <- o:
		default:
			o.fail(fmt.Errorf("%w: still starting, and %d messages already wait for this shard", ErrStopped, cap(s.inbox)))
		}
	default:
		o.fail(ErrStopped)
	}
}

// Submit judges m asynchronously: done is called exactly once, from a
// shard goroutine, after the decision is durable (or with an error when it
// cannot be made). done must not block: hand the result to another
// goroutine. guard, when set, runs on the shard against the current lease
// just before the judgement; an error from it refuses the message without
// judging it (wrap ErrPrecondition).
func (c *Coordinator) Submit(m lease.Message, guard func(lease.Lease) error, done func(Result, error)) {
	if m == nil {
		done(Result{}, fmt.Errorf("%w: nil message", ErrInvalidArgument))
		return
	}
	if jobKeyIsReserved(m.Job()) {
		done(Result{}, fmt.Errorf("%w: job id %q is reserved", ErrInvalidArgument, m.Job()))
		return
	}
	c.send(c.shardOf(m.Job()), op{kind: opJudge, msg: m, guard: guard, done: done})
}

// Apply judges m and waits for the durable answer. A rejection is a
// decision, not an error: errors are for messages that could not be judged
// or made durable.
func (c *Coordinator) Apply(ctx context.Context, m lease.Message) (Result, error) {
	return c.ApplyIf(ctx, m, nil)
}

// ApplyIf is Apply with a guard (see Submit).
func (c *Coordinator) ApplyIf(ctx context.Context, m lease.Message, guard func(lease.Lease) error) (Result, error) {
	ch := make(chan answer, 1)
	c.Submit(m, guard, func(r Result, err error) { ch <- answer{r, err} })
	return wait(ctx, ch)
}

// applyComputed judges the message compute derives from the job's current
// lease on its shard; when compute returns false nothing is judged and the
// answer (the lease as it then stands) comes once everything judged before
// it is durable.
func (c *Coordinator) applyComputed(ctx context.Context, job string, compute func(lease.Lease) (lease.Message, bool)) (Result, error) {
	ch := make(chan answer, 1)
	c.send(c.shardOf(job), op{kind: opCompute, job: job, compute: compute, done: func(r Result, err error) { ch <- answer{r, err} }})
	return wait(ctx, ch)
}

type answer struct {
	r   Result
	err error
}

func wait(ctx context.Context, ch chan answer) (Result, error) {
	select {
	case a := <-ch:
		return a.r, a.err
	case <-ctx.Done():
		// The message may still be judged and committed; the caller just
		// stopped waiting for the answer.
		return Result{}, ctx.Err()
	}
}

// Get returns the job's lease as last made durable: a decision judged but
// not yet committed is not visible (see the package documentation). A
// deadline the declared clock has passed is judged first (the shard's
// sweep, run before the read), and such a lease is returned once that is
// durable, never as if the deadline were still ahead; List likewise. While
// a run serves here, its shard answers from memory; otherwise — on a
// replica that does not lead, between runs, in a run fenced off — Get
// reads the store (StoredLease), which holds the same durable state.
func (c *Coordinator) Get(ctx context.Context, job string) (lease.Lease, error) {
	l, _, err := c.GetSettled(ctx, job)
	return l, err
}

// GetSettled is Get that also says whether a serving run answered: its
// shard, which judged the deadlines the clock had passed first. settled
// is false when Get read the store — no run served when it was asked, or
// the run stopped before its shard answered (a leader deposed meanwhile)
// — whose lease may be ACTIVE past an expiry that no run has decided yet.
// A caller that must not answer such a lease asks a serving run again
// when lease.Due says a deadline passed.
func (c *Coordinator) GetSettled(ctx context.Context, job string) (l lease.Lease, settled bool, err error) {
	if serving, _ := c.Serving(); !serving {
		l, err = c.StoredLease(ctx, job)
		return l, false, err
	}
	ch := make(chan answer, 1)
	c.send(c.shardOf(job), op{kind: opGet, job: job, done: func(r Result, err error) { ch <- answer{r, err} }})
	r, err := wait(ctx, ch)
	if errors.Is(err, ErrStopped) {
		// The run stopped between the check and the send.
		l, err = c.StoredLease(ctx, job)
		return l, false, err
	}
	return r.Lease, err == nil, err
}

// List returns up to limit durable leases in job-id order, starting after
// job id after, held by holder when holder is not empty. next is the last
// job id returned when more may follow.
func (c *Coordinator) List(ctx context.Context, holder, after string, limit int) (leases []lease.Lease, next string, err error) {
	return c.list(ctx, op{kind: opList, holder: holder, after: after, limit: limit})
}

// CountHeldBy counts the durable leases holder holds, by state: every one
// of them, from the counts each shard keeps by holder and state as its
// leases change (a stop rule's observed.leases_held, asked on every
// evaluation of the node: it costs a few numbers per shard, not a read of
// the holder's leases, finished ones included). List's pages are no
// substitute: a count of the first page was a count of the leases whose
// job ids sort first, and a coordinator choosing its workers' job ids
// chose which of their leases were counted.
func (c *Coordinator) CountHeldBy(ctx context.Context, holder string) (map[lease.State]int, error) {
	type part struct {
		counts map[lease.State]int
		err    error
	}
	ch := make(chan part, len(c.shards))
	for _, s := range c.shards {
		c.send(s, op{kind: opCount, holder: holder, counts: func(m map[lease.State]int, err error) { ch <- part{m, err} }})
	}
	out := map[lease.State]int{}
	for range c.shards {
		select {
		case p := <-ch:
			if p.err != nil {
				return nil, p.err
			}
			for state, n := range p.counts {
				out[state] += n
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// ListHeldBy is List of the durable leases held by any of holders, read
// from each shard's index by holder: it costs the holders' leases, not
// every job's (a rollout's handover lists a batch's members' leases on
// every pass). No holders, no leases.
func (c *Coordinator) ListHeldBy(ctx context.Context, holders []string, after string, limit int) (leases []lease.Lease, next string, err error) {
	if len(holders) == 0 {
		return nil, "", nil
	}
	return c.list(ctx, op{kind: opList, holders: holderSet(holders), after: after, limit: limit})
}

// list asks every shard for o's leases and merges their answers.
func (c *Coordinator) list(ctx context.Context, o op) (leases []lease.Lease, next string, err error) {
	limit := o.limit
	type part struct {
		leases []lease.Lease
		err    error
	}
	ch := make(chan part, len(c.shards))
	for _, s := range c.shards {
		o := o
		o.list = func(ls []lease.Lease, err error) { ch <- part{ls, err} }
		c.send(s, o)
	}
	for range c.shards {
		select {
		case p := <-ch:
			if p.err != nil {
				return nil, "", p.err
			}
			leases = append(leases, p.leases...)
		case <-ctx.Done():
			return nil, "", ctx.Err()
		}
	}
	slices.SortFunc(leases, func(a, b lease.Lease) int { return strings.Compare(a.JobID, b.JobID) })
	if limit > 0 && len(leases) > limit {
		leases = leases[:limit]
		next = leases[limit-1].JobID
	}
	return leases, next, nil
}

// Evidence returns the job's evidence rows in decision order, read from the
// store (so only durable rows). For a job without a lease it returns the
// rows of the bounded unknown-job log that name it; ErrNotFound when there
// are none.
func (c *Coordinator) Evidence(ctx context.Context, job string) ([]Row, error) {
	var rows []Row
	err := c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		rows = rows[:0]
		// A job's rows decode in order, each against the one before; rows
		// of the unknown-job log stand alone.
		log, err := readLog(tx, job)
		if err != nil {
			return err
		}
		if rows, err = decodedRows(tx, job, log); err != nil || len(rows) > 0 {
			return err
		}
		return tx.Scan([]byte(prefixUnknown), nil, func(key, value []byte) error {
			stored, err := decodeRow(lease.Lease{}, value)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if r := stored.row(lease.Lease{}); r.JobID == job {
				rows = append(rows, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: job %q", ErrNotFound, job)
	}
	return rows, nil
}

// decodedRows is the job's stored rows, decoded in order, each against the
// one before: those under its prefix, then log (the log's rows of this job).
func decodedRows(tx store.ReadTxn, job string, log []logRow) ([]Row, error) {
	var rows []Row
	var rr rowReader
	err := jobRows(tx, job, 1, log, func(_ uint64, key, value []byte) error {
		before := rr.prev
		stored, err := rr.next(value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		rows = append(rows, stored.row(before))
		return nil
	})
	return rows, err
}

// evidenceEachJobs is how many jobs one read of EndOfEach (and of
// CancelRequestOfEach) covers: a reader of one job reads the whole
// evidence log (up to its window's bytes and the newest commit's), so a
// termination's record of thousands of leases read it once per job before.
const evidenceEachJobs = 1024

// EvidenceCursor is where a page of evidence starts: after row number
// After of the job's rows, or, when Unknown, after sequence number After
// of the unknown-job log (for a job without a lease).
type EvidenceCursor struct {
	After   uint64
	Unknown bool
}

// EvidencePage is one page of a job's evidence.
type EvidencePage struct {
	Rows []Row
	// More: rows may follow; Next is where the next page starts.
	More bool
	Next EvidenceCursor
	// Stale is the job's former holders' counts (StaleTally) as of the
	// page's rows; none for the unknown-job log.
	Stale []StaleCount
}

// MaxEvidencePageBytes bounds the text of one page of evidence (the sum of
// its rows' rowBytes; a page holds at least one row): a holder's progress
// values and the reasons that quote them are its own text, up to
// lease.MaxValueBytes each and quoted (a control character four bytes), so
// a thousand rows of a rogue holder's late progress would make a page of
// about 20 MB, past what many clients take in one message (gRPC's 4 MiB by
// default). A page of ordinary rows, a few hundred bytes each, stops at its
// row count first.
const MaxEvidencePageBytes = 2 << 20

// rowBytes is a row's text as an Evidence answer carries it, roughly: its
// strings and a fixed allowance for the rest.
func rowBytes(r Row) int {
	n := 256 + len(r.JobID) + len(r.LeaseID) + len(r.HolderIdentity) + len(r.ProgressValue) + len(r.Reason)
	n += len(r.Names.Owner) + len(r.Names.ConflictHolder) + len(r.Names.PriorHolder) + len(r.Names.PriorLeaseID) + len(r.Names.PriorConflictHolder)
	for _, h := range r.Names.FormerHolders {
		n += len(h)
	}
	return n
}

// errNoAnchor: the row a page meant to start decoding at was not written
// whole (data written before anchors existed); decode from row 1.
var errNoAnchor = errors.New("coordinator: no anchor row")

// EvidencePage returns up to limit (at least 1) of the job's evidence rows
// from cursor on, in decision order, read from the store. A page decodes
// from the anchor row at or before the row before its first (anchorEvery),
// so its cost does not grow with the job's history. For a job without a lease
// the rows come from the bounded unknown-job log; ErrNotFound when the
// first page has no rows at all.
func (c *Coordinator) EvidencePage(ctx context.Context, job string, cursor EvidenceCursor, limit int) (EvidencePage, error) {
	limit = max(limit, 1)
	var page EvidencePage
	err := c.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		page = EvidencePage{}
		var bytes int
		keep := func(r Row) error {
			n := rowBytes(r)
			if len(page.Rows) == limit || len(page.Rows) > 0 && bytes+n > MaxEvidencePageBytes {
				page.More = true
				return store.ErrStopScan
			}
			page.Rows = append(page.Rows, r)
			bytes += n
			return nil
		}
		if !cursor.Unknown {
			// The former holders' counts, as of the same snapshot as
			// the rows (on every page of the job's own rows); a reserved
			// id's key is a layout marker, no record.
			switch b, err := tx.Get(jobKey(job)); {
			case jobKeyIsReserved(job):
			case err == nil:
				r, err := decodeRecord(b)
				if err != nil {
					return fmt.Errorf("%s: %w", jobKey(job), err)
				}
				page.Stale = append([]StaleCount(nil), r.Stale...)
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
			log, err := readLog(tx, job)
			if err != nil {
				return err
			}
			scanFrom := func(start uint64) error {
				page.Rows = page.Rows[:0]
				page.More, bytes = false, 0
				var rr rowReader
				first := true
				return jobRows(tx, job, start, log, func(_ uint64, key, value []byte) error {
					if first && start > 1 && !isAnchorRow(value) {
						return errNoAnchor
					}
					first = false
					before := rr.prev
					stored, err := rr.next(value)
					if err != nil {
						return fmt.Errorf("%s: %w", key, err)
					}
					if stored.Number <= cursor.After {
						return nil
					}
					return keep(stored.row(before))
				})
			}
			// Decoding starts at or before the row before the page's
			// first, so that every row's Names are known.
			err = scanFrom(anchorBefore(max(cursor.After, 1)))
			if errors.Is(err, errNoAnchor) {
				err = scanFrom(1)
			}
			if err != nil || len(page.Rows) > 0 || cursor.After > 0 {
				if n := len(page.Rows); n > 0 {
					page.Next = EvidenceCursor{After: page.Rows[n-1].Number}
				}
				return err
			}
		}
		if cursor.Unknown {
			// The unknown-job log is a job's evidence only while the job
			// has no lease: a token into it for a job with rows of its own
			// was made up, and would read messages about the id from
			// before the job was offered (another party's, to a reader
			// the job alone lets in).
			_, err := tx.Get(jobKey(job))
			switch {
			case err == nil:
				return fmt.Errorf("%w: page_token is not a token from an earlier Evidence answer for job %q", ErrInvalidArgument, job)
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
		}
		// A job without rows of its own: the unknown-job log, whose rows
		// stand alone and are numbered by the log.
		alone := func(b []byte) (storedRow, error) { return decodeRow(lease.Lease{}, b) }
		start := unknownKey(1)
		if cursor.Unknown {
			start = unknownKey(cursor.After + 1)
		}
		err := tx.Scan([]byte(prefixUnknown), start, func(key, value []byte) error {
			stored, err := alone(value)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if r := stored.row(lease.Lease{}); r.JobID == job {
				return keep(r)
			}
			return nil
		})
		if n := len(page.Rows); n > 0 {
			page.Next = EvidenceCursor{After: page.Rows[n-1].Number, Unknown: true}
		}
		return err
	})
	if err != nil {
		return EvidencePage{}, err
	}
	if len(page.Rows) == 0 && cursor == (EvidenceCursor{}) {
		return EvidencePage{}, fmt.Errorf("%w: job %q", ErrNotFound, job)
	}
	return page, nil
}

// nextUnknown numbers a row of the unknown-job log.
func (c *Coordinator) nextUnknown() uint64 {
	c.unknownMu.Lock()
	defer c.unknownMu.Unlock()
	c.unknownSeq++
	return c.unknownSeq
}

// heldBy returns the ids of the jobs whose current (judged) lease is held
// by one of holders, on every shard, those after job id after only, in
// order: with a limit, at least the first limit + 1 of them (each shard
// visits, in its ordered index, each holder's first limit + 1 after the
// start), so that a page of a holder's jobs costs a page, not every job it
// ever held after the page's start. openOnly lists only the jobs whose
// current lease is open (not terminal), from each shard's index of those:
// a holder's finished jobs are not visited at all.
func (c *Coordinator) heldBy(ctx context.Context, holders []string, after string, limit int, openOnly bool) ([]string, error) {
	set := holderSet(holders)
	type part struct {
		jobs []string
		err  error
	}
	ch := make(chan part, len(c.shards))
	for _, s := range c.shards {
		c.send(s, op{kind: opHeldBy, holders: set, after: after, limit: limit, openOnly: openOnly, jobs: func(jobs []string, err error) { ch <- part{jobs, err} }})
	}
	var jobs []string
	for range c.shards {
		select {
		case p := <-ch:
			if p.err != nil {
				return nil, p.err
			}
			jobs = append(jobs, p.jobs...)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	slices.Sort(jobs)
	return jobs, nil
}

// commitLoop makes the shards' sealed batches durable. When a commit
// returns, every shard in it answers with its next batch (what it judged
// meanwhile) or a pass, and the loop waits for all those answers, takes
// whatever else is waiting, and commits it all in one store Update (in
// chunks of at most Config.MaxBatch messages and Config.MaxCommitBytes; a
// batch is never split, and a shard seals its batches at those bounds).
// Committing each batch the moment it arrived would let the shards take
// turns — the first shard back would commit alone while the others' next
// batches were a goroutine hop away — and each commit would carry one
// shard's share. A shard has at most one batch in flight, so batches of
// one shard never share an Update and each shard's writes reach the store
// in judgement order.
//
// A pass does not go through the queue: the shard takes its reply off
// owed (replies), and wakes the loop only if the loop holds a batch and
// waits for that last reply. A lone writer's shard passes after every
// commit, and the loop, which then waits for the next batch anyway, is
// not woken for it: one goroutine hand-off less per lone commit.
func (c *Coordinator) commitLoop(queue <-chan *batch, replies *replies) {
	var group []*batch
	for {
		group = group[:0]
		closed := false
		take := func(b *batch) {
			if b.reply {
				replies.owed.Add(-1)
			}
			group = append(group, b)
		}
		for !closed {
			if len(group) > 0 {
				// Hold the batch until every shard of the last commit
				// answered. waiting is set before owed is read again,
				// and a pass takes its reply off before it reads
				// waiting, so one of them sees the other.
				replies.waiting.Store(true)
				if replies.owed.Load() <= 0 {
					replies.waiting.Store(false)
					break
				}
			}
			select {
			case b, ok := <-queue:
				if !ok {
					closed = true
					break
				}
				take(b)
			case <-replies.wake:
				// A pass, or a stale wake: the loop checks again.
			}
			replies.waiting.Store(false)
		}
	drain:
		for !closed {
			select {
			case b, ok := <-queue:
				if !ok {
					closed = true
					break drain
				}
				take(b)
			default:
				break drain
			}
		}
		// Owed before the batches go back: a shard may pass the moment it
		// has its batch.
		replies.owed.Add(int64(len(group)))
		for start := 0; start < len(group); {
			end, messages, bytes := start+1, group[start].messages, group[start].bytes
			for end < len(group) && messages+group[end].messages <= c.cfg.MaxBatch && bytes+group[end].bytes <= c.cfg.MaxCommitBytes {
				messages += group[end].messages
				bytes += group[end].bytes
				end++
			}
			c.commitGroup(group[start:end])
			start = end
		}
		clear(group)
		if closed {
			return
		}
	}
}

// replies counts the answers the committer waits for: one per batch it
// handed back, until its shard sends its next batch or passes.
type replies struct {
	owed atomic.Int64
	// waiting: the committer holds a batch and waits for owed to reach
	// zero; a pass that takes it there sends on wake (buffered, never
	// blocking).
	waiting atomic.Bool
	wake    chan struct{}
}

func newReplies() *replies { return &replies{wake: make(chan struct{}, 1)} }

// pass answers the committer for a shard that has nothing to commit.
func (r *replies) pass() {
	if r.owed.Add(-1) <= 0 && r.waiting.Load() {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// commitGroup commits batches of one run in one store Update, hands each
// back to its shard, and answers their callers if the commit succeeded (a
// failed batch is answered by its shard, which rolls it back first).
func (c *Coordinator) commitGroup(group []*batch) {
	// Not a caller's context: a batch carries many callers, and a decision
	// is either durable for all of them or for none.
	start := time.Now()
	var rows []logRow
	for _, b := range group {
		rows = append(rows, b.rows...)
	}
	log := c.evlog.plan(rows, c.cfg.MaxCommitBytes)
	err := c.cfg.Store.Update(context.Background(), func(tx store.Txn) error {
		if err := checkTerm(tx, group[0].term); err != nil {
			return err
		}
		for _, b := range group {
			for _, w := range b.puts {
				if err := tx.Put(w.key, w.value); err != nil {
					return err
				}
			}
			for _, k := range b.deletes {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
		}
		for _, w := range log.puts {
			if err := tx.Put(w.key, w.value); err != nil {
				return err
			}
		}
		for _, k := range log.deletes {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	c.commitNanos.Add(uint64(time.Since(start)))
	if err == nil {
		c.commits.Add(1)
		c.evlog.apply(log)
	} else {
		c.evlog.failed(log)
	}
	// Hand each batch back; its shard publishes the durable state and then
	// answers its callers (complete). Answering from here instead would
	// leave two goroutines runnable at once, the shard and a caller, and
	// the second wakes the idle processor: a lone renew's commit then
	// costs a thread wake-up more. From the shard the chain stays on one
	// processor: this loop blocks on its queue, the shard runs, answers
	// and blocks on its inbox, the caller runs.
	for _, b := range group {
		b.err = err
		b.shard.finished <- b
	}
}
