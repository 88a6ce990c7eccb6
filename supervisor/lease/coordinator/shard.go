package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

type opKind uint8

const (
	opJudge   opKind = iota + 1 // judge msg (after guard)
	opCompute                   // judge what compute derives from the current lease
	opGet                       // read the durable lease
	opList                      // list durable leases
	opHeldBy                    // ids of jobs whose current lease a holder holds (openOnly: of the open ones)
	opCount                     // count a holder's durable leases by state
)

// op is one request to a shard. Exactly one of its callbacks is set.
type op struct {
	kind    opKind
	msg     lease.Message
	guard   func(lease.Lease) error
	compute func(lease.Lease) (lease.Message, bool)
	done    func(Result, error)

	job     string
	holder  string
	after   string
	limit   int
	list    func([]lease.Lease, error)
	holders map[string]bool
	jobs    func([]string, error)
	counts  func(map[lease.State]int, error)
	// openOnly: an opHeldBy of the jobs whose current lease is open.
	openOnly bool
	// bounded: the message is judged within the bounds on open leases
	// (ApplyBounded), its holder counted under account; holderOnly: held
	// to the bound per holder only (ApplyHolderBounded).
	bounded    bool
	account    string
	holderOnly bool
}

func (o op) fail(err error) {
	switch {
	case o.done != nil:
		o.done(Result{}, err)
	case o.list != nil:
		o.list(nil, err)
	case o.jobs != nil:
		o.jobs(nil, err)
	case o.counts != nil:
		o.counts(nil, err)
	}
}

// entry is one job on its shard: the lease as last committed (durable,
// what reads see) and as last judged (pending, what the next message is
// judged against). They differ only while a commit is in flight.
type entry struct {
	job                      string
	durable, pending         lease.Lease
	durableRows, pendingRows uint64
	// checkpoint is the row number of the last durable job record. Every
	// row carries the lease, so the record is only rewritten every
	// checkpointEvery rows (and on a clean stop): that halves the writes of
	// a renewal.
	checkpoint uint64
	// account is the account (the holder's lineage) the judged lease is
	// counted under while it is open (openCounts), "" for none.
	account string
	// mark is the sequence of the last batch that touched the entry, so a
	// batch writes each lease record once however many messages it carries;
	// costed the last batch whose bytes count the record's rewrite.
	mark, costed uint64
	// durableStale and pendingStale count the messages of the job's former
	// holders, and of its holder once its generation ended (stalefold.go), as durable and as judged: they are only in
	// the record, so staleMark, the last batch that changed them, rewrites
	// it. A slice is never changed in place once set (a snapshot shares it).
	durableStale, pendingStale []StaleCount
	staleMark                  uint64
	// inJudged: the entry is filed in its shard's judged index, under
	// its pending lease's holder (setPending), so that a judgement, the
	// renewals' hot path, needs no search of the holder's jobs to know.
	inJudged bool
	// inOpenJudged: the entry is filed in its shard's openJudged index
	// (its pending lease is open), under that lease's holder.
	inOpenJudged bool
}

// batch is the writes of the messages a shard judged since its last
// submission, and the answers waiting for them to be durable.
type batch struct {
	shard *shard
	term  uint64
	// reply: the shard sends it in answer to its previous batch coming
	// back (Coordinator.commitLoop waits for those replies; a shard with
	// nothing to commit passes instead, through replies).
	reply    bool
	seq      uint64
	messages int
	// bytes is what the batch adds to a commit, roughly as the store
	// counts it (its rows, the records it rewrites, its other writes): a
	// shard seals a batch once it passes Config.MaxCommitBytes.
	bytes   int
	touched []*entry
	// snapshots are the touched entries' leases at sealing, in touched
	// order: what becomes durable when the batch commits; checkpoints
	// whether the batch rewrote the entry's record.
	snapshots   []record
	checkpoints []bool
	// final: the batch checkpoints the records of the entries it touched
	// whatever their rows (the clean stop's, checkpointAll).
	final   bool
	puts    []kv
	deletes [][]byte
	// rows are the evidence rows, in judgement order: the committer packs
	// them into the log (evidencelog.go).
	rows    []logRow
	answers []pendingAnswer
	err     error
	// decisions tallies what was judged, counted once durable.
	decisions tally
}

type kv struct{ key, value []byte }

type pendingAnswer struct {
	done   func(Result, error)
	result Result
}

func (b *batch) empty() bool { return b.messages == 0 && len(b.answers) == 0 }

// shard owns a subset of the jobs. Only its goroutine touches its fields
// while a run serves; between runs, Run resets and loads them. The inbox
// outlives runs (messages sent while a run starts wait in it).
type shard struct {
	c     *Coordinator
	index int
	// rowBuf is where judge encodes each row before copying it out at
	// its size: the encoding grows its buffer several times, once.
	rowBuf []byte
	// spare is a committed batch whose slices the next batch reuses
	// (recycle).
	spare *batch
	// ctx is the run's context without its cancellation (Run sets it).
	ctx   context.Context
	inbox chan op
	// unavailable memoizes Config.HolderUnavailable's answers for the
	// batch being built (unavailableSeq): the missed ACKs of many jobs
	// of a few holders, due at once, read each holder once, not once a
	// job, on the goroutine that judges every job of the shard.
	unavailable    map[string]string
	unavailableSeq uint64
	// term is the run's term; every commit checks it is still current.
	term uint64

	leases map[string]*entry
	// held indexes the durable leases by holder (setDurable keeps it), so
	// that a holder's listing (ListLeases, which any agent may ask about
	// itself) reads the holder's jobs, not every job of every tree on the
	// goroutine that judges them.
	held holderIndex
	// heldStates counts the durable leases in held by holder and state
	// (setDurable keeps it), so that a count of a holder's leases
	// (opCount: a stop rule's observed.leases_held, asked on every
	// evaluation of the node) reads a few numbers, not the holder's
	// leases, whose finished ones stay under it.
	heldStates map[string]map[lease.State]int
	// judged indexes every job by the holder of its judged (pending)
	// lease (setPending keeps it), so that a termination's cancel and
	// finalize of its nodes' leases (opHeldBy) read those nodes' jobs,
	// not every job of every tree, terminal ones included.
	judged holderIndex
	// openJudged indexes, of them, the jobs whose judged lease is open
	// (not terminal), by its holder (setPending keeps it), so that a
	// termination's cancel requests (CancelHeldBy: opHeldBy with open)
	// read the few jobs its nodes may still be working on, not every job
	// they ever finished, which stay under them in judged for ever.
	openJudged holderIndex
	deadlines  lease.DeadlineQueue
	recover    []lease.Recover

	// The commit pipeline: building collects what is being judged;
	// sealed are batches judged before it, closed when they reached
	// Config.MaxCommitBytes or Config.MaxBatch, waiting in order; inflight
	// is the batch being committed (at most one, so this shard's writes
	// reach the store in judgement order and an older lease record never
	// overwrites a newer one). The run's committer (Coordinator.
	// commitLoop) hands it back on finished.
	building *batch
	sealed   []*batch
	inflight *batch
	commits  chan<- *batch
	replies  *replies
	finished chan *batch
	// answers are the callers of committed batches, published and not
	// yet answered (answer).
	answers []pendingAnswer
	// owesReply: a batch came back and the committer waits for this
	// shard's next batch, or a pass, before it commits again.
	owesReply bool
	batchSeq  uint64
	// The hold (Config.Hold): the last commit answered expect callers,
	// and the next waits for as many messages until holdUntil. submitted
	// is when the commit in flight was handed over (its time bounds the
	// hold). Real time: how long a commit takes, not the declared clock.
	expect    int
	holdUntil time.Time
	submitted time.Time

	lastNow   time.Time
	aliveAt   time.Time
	needAlive bool
}

func newShard(c *Coordinator, index int) *shard {
	s := &shard{c: c, index: index, inbox: make(chan op, 1024)}
	s.reset(0)
	return s
}

// reset forgets everything a previous run knew, before a run loads the
// store: a run's memory is rebuilt from the store, never carried over.
func (s *shard) reset(term uint64) {
	s.term = term
	s.leases = make(map[string]*entry)
	s.held = make(holderIndex)
	s.heldStates = make(map[string]map[lease.State]int)
	s.judged = make(holderIndex)
	s.openJudged = make(holderIndex)
	s.deadlines = lease.DeadlineQueue{}
	s.recover = nil
	s.building, s.sealed, s.inflight, s.spare = nil, nil, nil, nil
	s.owesReply = false
	s.expect = 0
	s.finished = make(chan *batch, 1)
	s.lastNow, s.aliveAt, s.needAlive = time.Time{}, time.Time{}, false
}

// checkpointEvery is how many rows may follow a job's record before it is
// rewritten; a restart reads at most that many rows per job.
const checkpointEvery = 64

// load adds a lease read from the store (before the run's shards start).
func (s *shard) load(r record, checkpoint uint64) {
	e := &entry{job: r.Lease.JobID, durableRows: r.Rows, pendingRows: r.Rows, checkpoint: checkpoint,
		durableStale: r.Stale, pendingStale: r.Stale}
	s.leases[r.Lease.JobID] = e
	s.setPending(e, r.Lease)
	s.setDurable(e, r.Lease)
	s.deadlines.Sync(r.Lease)
}

// setDurable publishes l as e's durable lease and keeps the holder index.
func (s *shard) setDurable(e *entry, l lease.Lease) {
	before, after := e.durable, l
	e.durable = l
	if before.Exists() {
		s.countHeld(before, -1)
	}
	if after.Exists() {
		s.countHeld(after, 1)
	}
	if before.Exists() == after.Exists() && before.HolderIdentity == after.HolderIdentity {
		return
	}
	if before.Exists() {
		s.held.remove(before.HolderIdentity, e)
	}
	if after.Exists() {
		s.held.add(after.HolderIdentity, e)
	}
}

// countHeld adds n to the count of l's holder's leases in l's state.
func (s *shard) countHeld(l lease.Lease, n int) {
	states := s.heldStates[l.HolderIdentity]
	if states == nil {
		states = make(map[lease.State]int)
		s.heldStates[l.HolderIdentity] = states
	}
	if states[l.State] += n; states[l.State] <= 0 {
		delete(states, l.State)
		if len(states) == 0 {
			delete(s.heldStates, l.HolderIdentity)
		}
	}
}

// setPending makes l e's judged lease and keeps the indexes by its holder.
// Every job in leases is in judged under its judged lease's holder (an
// empty one included), so opHeldBy finds exactly the jobs a walk of leases
// would; and every job whose judged lease is open is in openJudged under
// that holder, so an opHeldBy of open jobs finds exactly the open ones.
func (s *shard) setPending(e *entry, l lease.Lease) {
	s.c.open.move(e, l)
	before, indexed := e.pending.HolderIdentity, e.inJudged
	e.pending = l
	isOpen := open(l)
	if e.inOpenJudged && (!isOpen || before != l.HolderIdentity) {
		s.openJudged.remove(before, e)
		e.inOpenJudged = false
	}
	if isOpen && !e.inOpenJudged {
		s.openJudged.add(l.HolderIdentity, e)
		e.inOpenJudged = true
	}
	if indexed && before == l.HolderIdentity {
		return
	}
	if indexed {
		s.judged.remove(before, e)
	}
	s.judged.add(l.HolderIdentity, e)
	e.inJudged = true
}

// now is the declared clock, read per decision, never going backwards on
// this shard: a stepped wall clock cannot make a later message look older.
func (s *shard) now() time.Time {
	t := s.c.cfg.Clock.Now().Round(0)
	if t.Before(s.lastNow) {
		return s.lastNow
	}
	s.lastNow = t
	return t
}

// run judges until stopping is closed, then commits what is left. The
// run's committer must outlive it: commits sends sealed batches there.
func (s *shard) run(stopping <-chan struct{}, commits chan<- *batch, replies *replies) {
	s.commits, s.replies = commits, replies
	s.building = s.newBatch()
	for _, r := range s.recover {
		if e := s.leases[r.JobID]; e != nil {
			s.judge(e, r.JobID, r, s.now(), nil)
			s.sealIfFull()
		}
	}
	s.recover = nil

	timer := time.NewTimer(s.c.cfg.MaxWait)
	defer timer.Stop()
	armedAt := time.Now().Add(s.c.cfg.MaxWait)
	for {
		s.submitIfIdle()
		// Sleep no longer than until the next deadline on the declared
		// clock, and never longer than MaxWait, in case that clock jumps.
		wait := s.c.cfg.MaxWait
		if d, ok := s.deadlines.Peek(); ok {
			wait = min(wait, max(0, d.At.Sub(s.c.cfg.Clock.Now())))
		}
		if s.expect > 0 {
			wait = min(wait, max(0, time.Until(s.holdUntil)))
		}
		if wakeAt := time.Now().Add(wait); wakeAt.Before(armedAt) {
			timer.Reset(wait)
			armedAt = wakeAt
		}
		inbox := s.inbox
		if len(s.sealed) > 0 {
			inbox = nil // back-pressure: the next batch is full
		}
		select {
		case o := <-inbox:
			s.handle(o)
			s.drainInbox(s.c.cfg.MaxBatch)
		case b := <-s.finished:
			s.complete(b)
			s.holdFor(b)
			s.recycle(b)
			// The next batch goes to the committer before the answers,
			// so the commit runs while they are delivered (unless it
			// waits for the callers answered: holding).
			s.submitIfIdle()
			s.answer()
		case <-timer.C:
			armedAt = time.Now().Add(365 * 24 * time.Hour)
			if !s.c.deposed.Load() {
				s.expire()
			}
		case <-stopping:
			s.shutdown()
			return
		}
	}
}

// drainInbox handles up to n more waiting ops without blocking, so one
// batch gathers everything that arrived during the last commit, until a
// batch is full.
func (s *shard) drainInbox(n int) {
	for range n {
		if len(s.sealed) > 0 {
			return
		}
		select {
		case o := <-s.inbox:
			s.handle(o)
		default:
			return
		}
	}
}

// shutdown judges what is left in the inbox (nobody can add more: the
// coordinator closed the door before signalling), commits everything with
// a clean-stop alive record, and answers.
func (s *shard) shutdown() {
	s.expect = 0 // no caller comes back: commit everything now
	for len(s.inbox) > 0 {
		s.handle(<-s.inbox)
		s.sealIfFull()
	}
	s.now() // the clean stop is the last time this run was alive
	s.needAlive = true
	checkpointed := false
	for {
		if s.inflight == nil && len(s.sealed) == 0 && s.building.empty() && !checkpointed {
			// Everything judged is durable: the last batches checkpoint
			// every record that lags its rows, so the next start reads no
			// rows beyond them.
			s.checkpointAll()
			checkpointed = true
		}
		s.submitIfIdle()
		if s.inflight == nil {
			return
		}
		s.complete(<-s.finished)
		s.answer()
	}
}

func (s *shard) handle(o op) {
	if s.c.deposed.Load() {
		o.fail(fmt.Errorf("%w: %w", ErrStopped, ErrFenced))
		return
	}
	switch o.kind {
	case opJudge:
		job := o.msg.Job()
		e := s.leases[job]
		if o.guard != nil {
			var current lease.Lease
			if e != nil {
				current = e.pending
			}
			if err := o.guard(current); err != nil {
				o.done(Result{}, err)
				return
			}
		}
		if o.bounded {
			var current lease.Lease
			if e != nil {
				current = e.pending
			}
			if holder := boundedHolder(o.msg, current); holder != "" {
				perHolder, perAccount := s.c.cfg.MaxOpenPerHolder, s.c.cfg.MaxOpenPerAccount
				if o.holderOnly {
					perAccount = 0
				}
				if err := s.c.open.reserve(holder, o.account, perHolder, perAccount); err != nil {
					o.done(Result{}, err)
					return
				}
				s.judge(e, job, o.msg, s.now(), o.done)
				s.c.open.release(holder, o.account)
				s.sealIfFull()
				return
			}
		}
		s.judge(e, job, o.msg, s.now(), o.done)
		s.sealIfFull()
	case opCompute:
		e := s.leases[o.job]
		var current lease.Lease
		if e != nil {
			current = e.pending
		}
		if m, ok := o.compute(current); ok {
			s.judge(e, o.job, m, s.now(), o.done)
			s.sealIfFull()
			return
		}
		// Nothing to judge: answer with the lease as it stands once what
		// was judged before is durable.
		if s.inflight == nil && len(s.sealed) == 0 && s.building.empty() {
			o.done(Result{Lease: current}, nil)
			return
		}
		s.building.answers = append(s.building.answers, pendingAnswer{done: o.done, result: Result{Lease: current}})
	case opGet:
		s.takeFinished()
		s.expireBeforeRead()
		e := s.leases[o.job]
		if e == nil || !e.durable.Exists() {
			o.done(Result{}, fmt.Errorf("%w: job %q", ErrNotFound, o.job))
			return
		}
		if lease.Due(e.durable, s.lastNow) {
			// What the clock decided was just judged (or is being
			// committed): answer it once durable, never the lease as
			// if the deadline had not passed.
			s.building.answers = append(s.building.answers, pendingAnswer{done: o.done, result: Result{Lease: e.pending, Row: e.pendingRows}})
			return
		}
		o.done(Result{Lease: e.durable, Row: e.durableRows}, nil)
	case opList:
		s.takeFinished()
		s.expireBeforeRead()
		// A page needs its first limit + 1 leases (the last says another
		// page follows): only those are copied and ordered, and a holder's
		// jobs, kept in order of id, are visited from the page's start
		// until the page has its own.
		keep := pageKeep(o.limit)
		first := newFirstJobs(keep, func(l *lease.Lease) string { return l.JobID })
		settling := false
		// offer keeps e's lease for the page if holder (any, when empty)
		// holds it, and reports whether it did.
		offer := func(e *entry, holder string) bool {
			if !e.durable.Exists() || (holder != "" && e.durable.HolderIdentity != holder) {
				return false
			}
			l := &e.durable
			if lease.Due(*l, s.lastNow) {
				// As for opGet: what the clock decided, once durable.
				l, settling = &e.pending, true
				if holder != "" && l.HolderIdentity != holder {
					return false
				}
			}
			first.offer(l)
			return true
		}
		take := func(holder string) {
			kept := 0
			for e := range s.held.after(holder, o.after) {
				s.c.listWalks.Add(1)
				if offer(e, holder) {
					if kept++; kept == keep {
						return
					}
				}
			}
		}
		switch {
		case o.holders != nil:
			for holder := range o.holders {
				take(holder)
			}
		case o.holder != "":
			take(o.holder)
		default:
			for job, e := range s.leases {
				if job > o.after {
					offer(e, "")
				}
			}
		}
		kept := first.sorted()
		out := make([]lease.Lease, len(kept))
		for i, l := range kept {
			out[i] = *l
		}
		s.c.listCopies.Add(int64(len(out)))
		if settling {
			list := o.list
			s.building.answers = append(s.building.answers, pendingAnswer{done: func(_ Result, err error) {
				if err != nil {
					list(nil, err)
					return
				}
				list(out, nil)
			}})
			return
		}
		o.list(out, nil)
	case opCount:
		s.takeFinished()
		counts := make(map[lease.State]int, len(s.heldStates[o.holder]))
		for state, n := range s.heldStates[o.holder] {
			s.c.countReads.Add(1)
			counts[state] = n
		}
		o.counts(counts, nil)
	case opHeldBy:
		keep := pageKeep(o.limit)
		first := newFirstJobs(keep, func(job string) string { return job })
		index := s.judged
		if o.openOnly {
			index = s.openJudged
		}
		for holder := range o.holders {
			kept := 0
			for e := range index.after(holder, o.after) {
				s.c.listWalks.Add(1)
				if e.pending.HolderIdentity != holder {
					continue
				}
				first.offer(e.job)
				if kept++; kept == keep {
					break
				}
			}
		}
		jobs := first.sorted()
		s.c.listCopies.Add(int64(len(jobs)))
		o.jobs(jobs, nil)
	}
}

// pageKeep is how many of the jobs it walks a shard keeps for a page of
// limit (0: every one): the page's, and one that says another follows.
func pageKeep(limit int) int {
	if limit <= 0 {
		return 0
	}
	return limit + 1
}

// takeFinished publishes a committed batch that is waiting, and answers
// its callers, before a read: a read sees at least what was committed.
func (s *shard) takeFinished() {
	select {
	case b := <-s.finished:
		s.complete(b)
		s.answer()
	default:
	}
}

// judge steps m against the job's current lease at now and adds the
// decision's writes and answer to the building batch. e is nil for a job
// this shard has never seen. done may be nil (the coordinator's own
// messages: ticks, recoveries, automatic reassignments).
func (s *shard) judge(e *entry, job string, m lease.Message, now time.Time, done func(Result, error)) {
	var current lease.Lease
	if e != nil {
		current = e.pending
	}
	next, decision, _ := lease.Step(current, m, now, s.c.cfg.Policy)
	b := s.building
	b.messages++
	b.decisions.add(decision)
	if e == nil && !next.Exists() {
		// No lease, so no job record: the row goes to the bounded log.
		seq := s.c.nextUnknown()
		row := storedRow{Number: seq, Lease: lease.Lease{JobID: job}, Decision: decision, Kind: m.Kind(), DecidedAt: now}
		w := kv{unknownKey(seq), encodeRow(nil, lease.Lease{}, row)}
		b.puts = append(b.puts, w)
		b.bytes += len(w.key) + len(w.value) + entryCost
		if size := uint64(s.c.cfg.UnknownLogSize); seq > size {
			b.deletes = append(b.deletes, unknownKey(seq-size))
			b.bytes += len(w.key) + entryCost
		}
		if done != nil {
			b.answers = append(b.answers, pendingAnswer{done: done, result: Result{Decision: decision}})
		}
		return
	}
	if e == nil {
		e = &entry{job: job}
		s.leases[job] = e
	}
	fold := false
	if holder, ok := staleSender(current, m); ok {
		e.pendingStale, fold = countStale(e.pendingStale, holder, current, next)
		e.staleMark = b.seq
	} else if len(e.pendingStale) > 0 {
		if pruned, dropped := pruneStale(e.pendingStale, next); dropped {
			e.pendingStale = pruned
			e.staleMark = b.seq
		}
	}
	if fold {
		// Judged and answered, counted in the record (rewritten by this
		// batch: staleMark) instead of adding a row; the lease is as it was.
		if e.mark != b.seq {
			e.mark = b.seq
			b.touched = append(b.touched, e)
		}
		if e.costed != b.seq {
			e.costed = b.seq
			b.bytes += recordCost(next) + staleCost(e.pendingStale)
		}
		if done != nil {
			b.answers = append(b.answers, pendingAnswer{done: done, result: Result{Lease: next, Decision: decision}})
		}
		return
	}
	s.setPending(e, next)
	e.pendingRows++
	row := storedRow{Number: e.pendingRows, Lease: next, Decision: decision, Kind: m.Kind(), DecidedAt: now}
	var encoded []byte
	if isAnchor(row.Number) {
		encoded = encodeRowAnchor(nil, row)
	} else {
		s.rowBuf = encodeRow(s.rowBuf[:0], current, row)
		encoded = bytes.Clone(s.rowBuf)
	}
	b.rows = append(b.rows, logRow{job, row.Number, encoded})
	b.bytes += len(job) + len(encoded) + 8
	if e.mark != b.seq {
		e.mark = b.seq
		b.touched = append(b.touched, e)
	}
	if e.costed != b.seq && (e.checkpoint == 0 || e.pendingRows-e.checkpoint >= checkpointEvery || e.staleMark == b.seq) {
		// The batch will rewrite the record (seal): count it now, as the
		// lease stands; what the batch changes in it later comes with rows
		// counted too.
		e.costed = b.seq
		b.bytes += recordCost(next) + staleCost(e.pendingStale)
	}
	s.deadlines.Sync(next)
	if done != nil {
		b.answers = append(b.answers, pendingAnswer{done: done, result: Result{Lease: next, Decision: decision, Row: row.Number}})
	}
	if r, auto := m.(lease.Reassign); !(auto && r.Automatic) && missedNow(current, next) && lease.ReassignDue(next, s.c.cfg.Policy) {
		// Once per judgement: an automatic reassignment the lease machine
		// refused leaves the job due for one, and stepping another after it
		// recursed without end (rogue34e test). And once per missed ACK:
		// one withheld for its holder's state is not tried again by the
		// holder's next message (each would have read its node on this
		// goroutine and added a row; rogue35e test).
		r := lease.AutomaticReassign(next, s.c.cfg.Policy, s.c.cfg.NewLeaseID(), s.c.cfg.PickHolder(next))
		r.HolderUnavailable = s.holderUnavailable(r.HolderIdentity)
		s.judge(e, job, r, now, nil)
	}
}

// holderUnavailable is Config.HolderUnavailable's answer about holder,
// asked once per holder per batch.
func (s *shard) holderUnavailable(holder string) string {
	if s.c.cfg.HolderUnavailable == nil {
		return ""
	}
	if s.unavailable == nil || s.unavailableSeq != s.building.seq {
		s.unavailable, s.unavailableSeq = map[string]string{}, s.building.seq
	}
	if why, ok := s.unavailable[holder]; ok {
		return why
	}
	ctx := s.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	why := s.c.cfg.HolderUnavailable(ctx, holder)
	s.unavailable[holder] = why
	return why
}

// missedNow reports whether the judgement from current to next is the one
// that found the generation's ACK deadline missed.
func missedNow(current, next lease.Lease) bool {
	return next.State == lease.StateExpired && next.AckState == lease.AckMissed &&
		(current.State != lease.StateExpired || current.AckState != lease.AckMissed || current.Generation != next.Generation)
}

// expire acts on the deadlines the declared clock has reached: finding
// them (PopDue) and acting on them (a Tick each, through the same pipeline
// as every message) are separate steps.
func (s *shard) expire() {
	now := s.now()
	for _, d := range s.deadlines.PopDue(now) {
		e := s.leases[d.JobID]
		if e == nil {
			continue
		}
		if at, ok := lease.NextDeadline(e.pending); !ok || at.After(now) {
			s.deadlines.Sync(e.pending)
			continue
		}
		s.judge(e, d.JobID, lease.Tick{JobID: d.JobID}, now, nil)
		s.sealIfFull()
	}
	if s.inflight == nil && len(s.sealed) == 0 && s.building.empty() && now.Sub(s.aliveAt) >= s.c.cfg.AliveInterval {
		s.needAlive = true
	}
}

// expireBeforeRead is the deadline sweep (expire), run before a read
// rather than when the shard's timer next fires: a read after the
// declared clock passed a deadline answers what the clock decided, not
// the lease as its last commit left it (a holder gone quiet read ACTIVE
// past its expiry, an offer nobody ACKed OFFERED past its deadline, until
// the sweep — up to Config.MaxWait of real time and a commit later). The
// ticks are the sweep's own, judged once: a later sweep finds nothing due.
func (s *shard) expireBeforeRead() { s.expire() }

func (s *shard) newBatch() *batch {
	s.batchSeq++
	b := &batch{shard: s, term: s.term, seq: s.batchSeq}
	if sp := s.spare; sp != nil {
		s.spare = nil
		b.touched, b.snapshots, b.checkpoints, b.answers = sp.touched[:0], sp.snapshots[:0], sp.checkpoints[:0], sp.answers[:0]
	}
	return b
}

// recycleCap bounds the slices a committed batch leaves to the next one:
// a termination's batch of thousands is not kept for the renewals after.
const recycleCap = 128

// recycle keeps the slices of b, committed and published (complete) and
// its answers moved to the shard's (s.answers), for the next batch: an
// answer and a snapshot each hold a lease, so growing them again for
// every commit of a few dozen renewals allocated some 100 KB a commit.
// Nothing reads b's elements after complete; they are zeroed here so that
// the leases and callbacks they held go.
func (s *shard) recycle(b *batch) {
	if b.err != nil || max(cap(b.touched), cap(b.snapshots), cap(b.checkpoints), cap(b.answers)) > recycleCap {
		return
	}
	clear(b.touched)
	clear(b.snapshots)
	clear(b.answers)
	s.spare = b
}

// entryCost is what the store adds to a write beyond its key and value
// (Badger's per-entry allowance, as the store counts it).
const entryCost = 32

// recordCost bounds what rewriting l's record adds to a commit: its key,
// the lease's strings (the job id twice, in the key and the value), a
// fixed allowance for its numbers, times and lengths, and the entry.
func recordCost(l lease.Lease) int {
	n := len(prefixJob) + 2*len(l.JobID) + len(l.LeaseID) + len(l.HolderIdentity) + len(l.Owner) +
		len(l.ConflictHolder) + len(l.ProgressValue) + len(l.TerminalDetail) + 192 + entryCost
	for _, h := range l.FormerHolders {
		n += len(h) + 2
	}
	return n
}

// sealIfFull seals the building batch once it carries Config.MaxBatch
// messages or Config.MaxCommitBytes: a shard judges any number of
// messages between two commits (a termination's thousands of cancels,
// the ticks of every lease expiring at once, a restart's recoveries), and
// one store transaction takes only so much. Called between messages, so
// that a message and the automatic reassignment it causes share a batch.
func (s *shard) sealIfFull() {
	if b := s.building; b.messages >= s.c.cfg.MaxBatch || b.bytes >= s.c.cfg.MaxCommitBytes {
		s.seal()
	}
}

// seal closes the building batch: the leases it touched are fixed as they
// stand now (what becomes durable when it commits), with the records it
// rewrites, and it waits in sealed while judging goes on in a new one.
func (s *shard) seal() {
	b := s.building
	for _, e := range b.touched {
		r := record{Lease: e.pending, Rows: e.pendingRows, Stale: e.pendingStale}
		write := b.final || e.checkpoint == 0 || r.Rows-e.checkpoint >= checkpointEvery || e.staleMark == b.seq
		b.snapshots = append(b.snapshots, r)
		b.checkpoints = append(b.checkpoints, write)
		if write {
			b.puts = append(b.puts, kv{jobKey(e.pending.JobID), encodeRecord(nil, r)})
		}
	}
	s.sealed = append(s.sealed, b)
	s.building = s.newBatch()
}

// checkpointAll seals batches that rewrite the record of every entry whose
// record lags its rows (the clean stop), at most Config.MaxCommitBytes of
// records each: a coordinator holding thousands of jobs wrote them all in
// one transaction, past what the store takes ("transaction too large"),
// and the clean stop's checkpoints were lost whole. Each record is a
// checkpoint of rows already durable, so a stop between two of these
// commits (kill -9) leaves every job loadable: its record, then the rows
// after it.
func (s *shard) checkpointAll() {
	for _, e := range s.leases {
		if e.pendingRows <= e.checkpoint {
			continue
		}
		b := s.building
		b.final = true
		e.mark = b.seq
		b.touched = append(b.touched, e)
		b.bytes += recordCost(e.pending) + staleCost(e.pendingStale)
		if b.bytes >= s.c.cfg.MaxCommitBytes {
			s.seal()
		}
	}
	if len(s.building.touched) > 0 {
		s.seal()
	}
}

// submitIfIdle hands the oldest sealed batch, or else the building one, to
// the run's committer when no commit of this shard is in flight. Judging
// goes on meanwhile; the next batch gathers it.
func (s *shard) submitIfIdle() {
	if s.inflight != nil || s.holding() {
		return
	}
	if len(s.sealed) == 0 {
		if s.building.empty() && (!s.needAlive || s.c.deposed.Load()) {
			if s.owesReply {
				s.owesReply = false
				s.replies.pass()
			}
			return
		}
		s.seal()
	}
	b := s.sealed[0]
	s.sealed[0] = nil
	s.sealed = s.sealed[1:]
	alive := encoder{}
	alive.time(s.lastNow)
	b.puts = append(b.puts, kv{aliveKey(s.index), alive.b})
	s.aliveAt = s.lastNow
	s.needAlive = false
	b.reply, s.owesReply = s.owesReply, false
	s.inflight = b
	s.submitted = time.Now()
	s.commits <- b
}

// holdFor starts the hold for the callers the committed batch b answers:
// each may send its next message as soon as it is answered (a renewer in
// a closed loop does), and committing before they come sends them to wait
// a whole commit for the one after, the callers split between batches
// that take turns. The hold lasts until as many messages as b answered
// are judged, or for as long as b's commit took (Config.Hold), whichever
// comes first; the committer, which waits for every shard's reply, waits
// with it.
func (s *shard) holdFor(b *batch) {
	s.expect = 0
	hold := s.c.cfg.Hold
	// One caller answered alone finds the shard idle when it comes back
	// and is committed at once: holding for it would gather nothing, and
	// cost a lone renewer a timer's wake-up per renew (measured: its p50
	// 0.76 → 0.83–1.05 ms).
	if b.err != nil || len(b.answers) < 2 || hold < 0 || s.c.deposed.Load() {
		return
	}
	if hold == 0 {
		hold = min(time.Since(s.submitted), DefaultMaxHold)
	}
	s.expect, s.holdUntil = len(b.answers), time.Now().Add(hold)
}

// holding reports that the next commit waits for the callers the last one
// answered: fewer messages than them judged since, the hold not over, and
// no batch full.
func (s *shard) holding() bool {
	if s.expect == 0 {
		return false
	}
	if len(s.sealed) > 0 || s.building.messages >= s.expect || !time.Now().Before(s.holdUntil) || s.c.deposed.Load() {
		s.expect = 0
		return false
	}
	return true
}

// answer delivers the answers of the committed batches complete published.
// The shard answers them, not the committer: the committer blocks on its
// queue once it handed the batches back, the shard runs, answers and
// blocks on its inbox, and the caller runs, all on one processor, where
// answering from the committer left the shard and a caller runnable at
// once and woke the idle processor for one of them.
func (s *shard) answer() {
	for i, a := range s.answers {
		a.done(a.result, nil)
		s.answers[i] = pendingAnswer{}
	}
	s.answers = s.answers[:0]
}

// complete publishes a committed batch (durable state, then answers) or,
// when the commit failed, rolls back everything judged since the last
// durable state: the failed batch and those judged on top of it.
func (s *shard) complete(b *batch) {
	s.inflight = nil
	s.owesReply = true
	if b.err == nil {
		s.c.judged.Add(uint64(b.messages))
		s.c.countDecisions(&b.decisions)
		for i, e := range b.touched {
			s.setDurable(e, b.snapshots[i].Lease)
			e.durableRows = b.snapshots[i].Rows
			e.durableStale = b.snapshots[i].Stale
			if b.checkpoints[i] {
				e.checkpoint = e.durableRows
			}
		}
		// Answered (answer) once the durable state is published, so a
		// read that follows an answer sees its lease.
		s.answers = append(s.answers, b.answers...)
		return
	}
	err := fmt.Errorf("%w: %w", ErrCommit, b.err)
	if errors.Is(b.err, ErrFenced) {
		s.c.depose(b.err)
	} else {
		messages := b.messages + s.building.messages
		for _, w := range s.sealed {
			messages += w.messages
		}
		s.c.cfg.Log.Error("lease shard commit failed; rolling back to the durable state", "shard", s.index, "err", b.err,
			"messages", messages)
	}
	failed := append(append([]*batch{b}, s.sealed...), s.building)
	for _, f := range failed {
		for _, e := range f.touched {
			s.setPending(e, e.durable)
			e.pendingRows = e.durableRows
			e.pendingStale = e.durableStale
			if !e.durable.Exists() {
				s.judged.remove(e.pending.HolderIdentity, e)
				e.inJudged = false
				delete(s.leases, e.job)
				s.deadlines.Remove(e.job)
				continue
			}
			s.deadlines.Sync(e.durable)
		}
	}
	var answers []pendingAnswer
	for _, f := range failed {
		answers = append(answers, f.answers...)
	}
	s.sealed = nil
	s.building = s.newBatch()
	for _, a := range answers {
		a.done(Result{}, err)
	}
}
