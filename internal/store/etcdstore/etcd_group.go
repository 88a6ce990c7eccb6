package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Group commit: the commits of concurrent Updates go to etcd together, in
// one request, as Badger's committer makes one sync serve many Updates.
// While a merged commit is in flight, the commits that arrive queue; when
// it returns, the queue goes as the next one. A commit that finds no
// commit in flight goes at once, alone, so a lone Update waits for nothing.
//
// A merged commit is one etcd Txn whose operations are the members' own
// transactions, nested: Txn().Then(Txn(compares₁).Then(writes₁), ...).
// etcd applies it atomically, at one revision, and answers, for each
// nested transaction, whether its comparisons held: a member whose
// comparisons failed conflicted, and is retried alone (as any conflict
// is); the others are committed. Each member learns its outcome only once
// the merged commit returned, so no Update returns before its writes are
// durable.
//
// etcd evaluates the comparisons of every nested transaction against the
// state before the merged transaction applies anything. So members are
// merged only when none writes a key another reads, compares, scans or
// writes: then every member's comparisons see, at that state, what they
// would see after the other members' writes, and the merged commit is
// equivalent to committing the members one after the other, in any
// order. A member that overlaps one already taken waits for the next
// commit, where its comparisons see the first's writes.
//
// Large commits (a termination's chunk) go alone and at once, beside the
// merged ones, as before: merging them would save no request worth having
// and would delay the small ones behind them.

// Bounds of what is merged.
const (
	// groupMaxMembers is the most Updates one merged commit carries.
	groupMaxMembers = 256
	// groupMaxMemberOps and groupMaxMemberBytes bound the commits that
	// are merged: larger ones go alone.
	groupMaxMemberOps   = 256
	groupMaxMemberBytes = 64 << 10
	// groupNestOverhead is a rough upper bound of what nesting adds to a
	// member's request (the nested Txn's tags and lengths).
	groupNestOverhead = 16
)

// mergeQueue is what waits for the merged request in flight: items that
// arrive while one is in flight queue, and the queue goes as the next
// request when it returns; an item that finds none in flight goes at once.
type mergeQueue[T any] struct {
	mu    sync.Mutex
	queue []T
	// busy is set while a merged request is in flight (or about to be
	// sent).
	busy bool
}

// join queues it and reports whether the caller is to send the queue now
// (no request was in flight).
func (q *mergeQueue[T]) join(it T) (send bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, it)
	send = !q.busy
	q.busy = true
	return send
}

// next takes the next request's items with take, which returns them and
// the items left waiting, in order.
func (q *mergeQueue[T]) next(take func([]T) (batch, rest []T)) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	batch, rest := take(q.queue)
	q.queue = rest
	return batch
}

// sent is called when a request returned; it reports whether more wait,
// to be sent by the caller (then still busy), or the queue is idle.
func (q *mergeQueue[T]) sent() (more bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy = len(q.queue) > 0
	return q.busy
}

// drop takes out of the queue, in order, the items doomed reports, and
// returns them.
func (q *mergeQueue[T]) drop(doomed func(T) bool) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []T
	kept := q.queue[:0]
	for _, it := range q.queue {
		if doomed(it) {
			out = append(out, it)
			continue
		}
		kept = append(kept, it)
	}
	clear(q.queue[len(kept):])
	q.queue = kept
	return out
}

// hold makes items queue as if a request were in flight (tests).
func (q *mergeQueue[T]) hold() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy = true
}

// waiting is how many items wait.
func (q *mergeQueue[T]) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// groupMember is one Update's commit waiting in the queue.
type groupMember struct {
	req commitRequest
	t   *etcdTxn
	// writes are the etcd keys the commit writes, reads those its
	// comparisons are about (keys read, expected), spans the ranges it
	// scanned (merged, sorted).
	writes []string
	reads  []string
	spans  []etcdSpan
	done   chan groupOutcome
}

// landed is what the members of a commit that succeeded wrote, at the
// revision the commit was applied at: by etcd key, whether the key was
// put (false: deleted).
type landed struct {
	rev  int64
	puts map[string]bool
}

type groupOutcome struct {
	conflict bool
	err      error
}

// groupable reports whether a commit may be merged with others.
func groupable(req commitRequest) bool {
	return len(req.ops) <= groupMaxMemberOps && len(req.compares) <= groupMaxMemberOps && req.bytes <= groupMaxMemberBytes
}

func newGroupMember(t *etcdTxn, req commitRequest) *groupMember {
	m := &groupMember{req: req, t: t, spans: mergeSpans(t.spans), done: make(chan groupOutcome, 1)}
	m.writes = make([]string, 0, len(t.writes))
	for k := range t.writes {
		m.writes = append(m.writes, t.snap.store.keys.key([]byte(k)))
	}
	m.reads = make([]string, 0, len(t.reads)+len(t.expects)+len(t.expectRevs))
	for k := range t.reads {
		m.reads = append(m.reads, k)
	}
	for k := range t.expects {
		m.reads = append(m.reads, k)
	}
	for k := range t.expectRevs {
		m.reads = append(m.reads, k)
	}
	return m
}

// commitInGroup commits m's request, merged with the commits of other
// Updates that are waiting meanwhile, and returns its outcome once the
// request that carried it has returned.
func (s *Etcd) commitInGroup(m *groupMember) (conflict bool, err error) {
	if s.group.join(m) {
		s.flushGroup()
	}
	o := <-m.done
	return o.conflict, o.err
}

// flushGroup sends the queue's next merged commit and answers its members;
// if more wait, another goroutine sends the next (so that this one can
// return to its Update).
func (s *Etcd) flushGroup() {
	if l := s.commitMerged(s.group.next(takeCommits)); l.rev != 0 {
		s.answerDoomed(l)
	}
	if s.group.sent() {
		go s.flushGroup()
	}
}

// takeCommits takes from queue, in order, the members that can go in one
// commit: disjoint as the package comment says, within the bounds.
func takeCommits(queue []*groupMember) (batch, rest []*groupMember) {
	var b groupBatch
	for _, m := range queue {
		if len(batch) < groupMaxMembers && b.admits(m) {
			b.add(m)
			batch = append(batch, m)
			continue
		}
		rest = append(rest, m)
	}
	return batch, rest
}

// groupBatch is what the members taken so far touch, and their size.
type groupBatch struct {
	writes map[string]bool
	reads  map[string]bool
	spans  []etcdSpan
	ops    int // the most operations of a member's level, for --max-txn-ops
	bytes  int
	n      int
}

// admits reports whether m can join: it writes nothing the others read,
// scan or write, reads and scans nothing they write, and the merged
// request stays within etcd's limits.
func (b *groupBatch) admits(m *groupMember) bool {
	if b.n == 0 {
		return true
	}
	opts := &m.t.snap.store.opts
	ops := max(b.ops, len(m.req.ops), len(m.req.compares))
	if ops+b.n+1 > opts.MaxTxnOps || b.bytes+m.req.bytes+groupNestOverhead > opts.MaxRequestBytes {
		return false
	}
	for _, w := range m.writes {
		if b.writes[w] || b.reads[w] || inSpans(b.spans, w) {
			return false
		}
	}
	for _, r := range m.reads {
		if b.writes[r] {
			return false
		}
	}
	for _, sp := range m.spans {
		for w := range b.writes {
			if sp.contains(w) {
				return false
			}
		}
	}
	return true
}

func (b *groupBatch) add(m *groupMember) {
	if b.writes == nil {
		b.writes, b.reads = map[string]bool{}, map[string]bool{}
	}
	for _, w := range m.writes {
		b.writes[w] = true
	}
	for _, r := range m.reads {
		b.reads[r] = true
	}
	b.spans = append(b.spans, m.spans...)
	b.ops = max(b.ops, len(m.req.ops), len(m.req.compares))
	b.bytes += m.req.bytes + groupNestOverhead
	b.n++
}

// inSpans reports whether key lies in one of spans (in any order).
func inSpans(spans []etcdSpan, key string) bool {
	for _, sp := range spans {
		if sp.contains(key) {
			return true
		}
	}
	return false
}

// answerDoomed answers, at once, the commits waiting in the queue that
// can only fail now that l landed: each read, at a revision before l's, a
// key l wrote (a comparison of its mod revision, which l changed: a key
// read present, then put or deleted, or read absent, then put) or scanned
// a range l put a key in (the range's comparison that no key in it is
// newer than the read). Sent, each would go to etcd as a commit of its
// own that etcd refuses for that comparison (takeCommits sends a
// member that overlaps one taken in a later commit than that one); they
// are answered the conflict etcd would answer, and retried as any
// conflict is, without the round trip and the consensus a refused commit
// costs the member. Nothing of theirs was applied, so no Update returns
// before its writes are durable. Comparisons of values (Expect) and of
// revisions taken from a watch (ExpectRevision) are not judged here: a
// member with those, and no such read, is sent as before.
func (s *Etcd) answerDoomed(l landed) {
	doomed := s.group.drop(func(m *groupMember) bool { return m.doomedBy(l) })
	for _, m := range doomed {
		s.stats.doomed.Add(1)
		m.done <- groupOutcome{true, conflictError(m.t)}
	}
}

// doomedBy reports whether m's commit must fail after l (answerDoomed).
func (m *groupMember) doomedBy(l landed) bool {
	t := m.t
	if t.snap.rev == 0 || t.snap.rev >= l.rev {
		// It read nothing, or read what l wrote.
		return false
	}
	if len(t.reads) < len(l.puts) {
		for k, r := range t.reads {
			if put, ok := l.puts[k]; ok && (put || r.modRevision != 0) {
				return true
			}
		}
	} else {
		for k, put := range l.puts {
			if r, ok := t.reads[k]; ok && (put || r.modRevision != 0) {
				return true
			}
		}
	}
	if len(m.spans) == 0 {
		return false
	}
	for k, put := range l.puts {
		if put && inSpans(m.spans, k) {
			return true
		}
	}
	return false
}

// landedOf is what the members of batch that succeeded (ok[i]) wrote, at
// revision rev.
func landedOf(batch []*groupMember, ok []bool, rev int64) landed {
	l := landed{rev: rev, puts: map[string]bool{}}
	for i, m := range batch {
		if !ok[i] {
			continue
		}
		for _, mu := range m.t.writes {
			l.puts[m.t.snap.store.keys.key(mu.key)] = !mu.deleted
		}
	}
	if len(l.puts) == 0 {
		return landed{}
	}
	return l
}

// commitMerged sends batch as one commit (a member alone as its own Txn),
// answers every member, and returns what the members that succeeded wrote
// (landed{} when none did, or the outcome is not known).
func (s *Etcd) commitMerged(batch []*groupMember) landed {
	switch len(batch) {
	case 0:
		return landed{}
	case 1:
		conflict, rev, err := s.commitAloneAt(batch[0].t, batch[0].req)
		var l landed
		if !conflict && err == nil && s.group.waiting() > 0 {
			// Taken before the member's Update goes on.
			l = landedOf(batch, []bool{true}, rev)
		}
		batch[0].done <- groupOutcome{conflict, err}
		return l
	}
	ops := make([]clientv3.Op, len(batch))
	for i, m := range batch {
		ops[i] = clientv3.OpTxn(m.req.compares, m.req.ops, nil)
	}
	ctx, cancel := s.commitContext()
	defer cancel()
	s.stats.commits.Add(1)
	s.stats.merged.Add(uint64(len(batch)))
	for _, m := range batch {
		s.stats.carried(m.req)
	}
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	if err == nil && len(resp.Responses) != len(batch) {
		err = fmt.Errorf("store: etcd answered %d of %d merged transactions", len(resp.Responses), len(batch))
	}
	if err != nil {
		if tooLarge(err) {
			// A member refused for the others' size: each goes alone,
			// as it would have unmerged (nothing was applied).
			s.commitEachAlone(batch)
			return landed{}
		}
		for _, m := range batch {
			m.done <- groupOutcome{false, s.commitError(err, m.req)}
		}
		return landed{}
	}
	outcomes := make([]groupOutcome, len(batch))
	ok := make([]bool, len(batch))
	for i, m := range batch {
		nested := resp.Responses[i].GetResponseTxn()
		switch {
		case nested == nil:
			outcomes[i] = groupOutcome{false, fmt.Errorf("store: etcd answered a merged transaction with %T; %s", resp.Responses[i].Response, etcdOutcomeUnknown)}
		case !nested.Succeeded:
			outcomes[i] = groupOutcome{true, conflictError(m.t)}
		default:
			ok[i] = true
		}
	}
	// Taken before the members' Updates go on, when commits wait (one
	// that joins the queue later is sent as before).
	var l landed
	if s.group.waiting() > 0 {
		l = landedOf(batch, ok, resp.Header.Revision)
	}
	for i, m := range batch {
		m.done <- outcomes[i]
	}
	return l
}

func (s *Etcd) commitEachAlone(batch []*groupMember) {
	var wg sync.WaitGroup
	for _, m := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conflict, err := s.commitAlone(m.t, m.req)
			m.done <- groupOutcome{conflict, err}
		}()
	}
	wg.Wait()
}

// tooLarge reports whether etcd refused a request for its size, before
// applying anything.
func tooLarge(err error) bool {
	return errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted
}

// First reads are merged the same way. A View's or an Update attempt's
// first read fixes its snapshot's revision and must see every commit
// acknowledged before the snapshot began (it is linearizable); a read
// request sent after several snapshots began sees, for each of them, all
// that. So the first reads of snapshots that wait while one is in flight
// go together, as one read-only Txn, and share its revision: concurrent
// cancel acknowledgements, each a read then a commit, then cost two
// requests per batch of them instead of two each.

// groupMaxReadOps bounds the ranges of a first read that is merged (and
// of a merged one, with the store's prefetch bound): larger ones go alone.
const groupMaxReadOps = 64

type firstRead struct {
	ctx  context.Context
	ops  []clientv3.Op
	done chan firstReadOutcome
}

type firstReadOutcome struct {
	resps []*clientv3.GetResponse
	rev   int64
	err   error
}

// firstRead reads ops (ranges) as the snapshot's first read, merged with
// the first reads of other snapshots waiting meanwhile, and fixes the
// snapshot's revision. Errors are etcd's, as the request returned them.
func (r *etcdSnapshot) firstRead(ops []clientv3.Op) ([]*clientv3.GetResponse, error) {
	s := r.store
	m := &firstRead{ctx: r.ctx, ops: ops, done: make(chan firstReadOutcome, 1)}
	if s.reads.join(m) {
		s.flushReads()
	}
	select {
	case o := <-m.done:
		if o.err == nil {
			r.rev = o.rev
		}
		return o.resps, o.err
	case <-r.ctx.Done():
		return nil, r.ctx.Err()
	}
}

// flushReads sends the queue's next merged read and answers its members;
// if more wait, another goroutine sends the next.
func (s *Etcd) flushReads() {
	budget := min(s.opts.MaxTxnOps, int(s.prefetchOps.Load()))
	s.readMerged(s.reads.next(func(queue []*firstRead) (batch, rest []*firstRead) {
		n := 0
		for len(queue) > 0 && (len(batch) == 0 || n+len(queue[0].ops) <= budget) {
			n += len(queue[0].ops)
			batch, queue = append(batch, queue[0]), queue[1:]
		}
		return batch, queue
	}))
	if s.reads.sent() {
		go s.flushReads()
	}
}

// readMerged sends batch's reads as one read-only Txn and answers each
// member. The request ends when every member has stopped waiting for it,
// or at Close.
func (s *Etcd) readMerged(batch []*firstRead) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAtClose := context.AfterFunc(s.lifetime, cancel)
	defer stopAtClose()
	var waiting atomic.Int32
	waiting.Store(int32(len(batch)))
	var ops []clientv3.Op
	for _, m := range batch {
		ops = append(ops, m.ops...)
		stop := context.AfterFunc(m.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	s.stats.reads.Add(1)
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	if err == nil && len(resp.Responses) != len(ops) {
		err = fmt.Errorf("store: etcd answered %d of %d ranges", len(resp.Responses), len(ops))
	}
	i := 0
	for _, m := range batch {
		if err != nil {
			m.done <- firstReadOutcome{err: err}
			continue
		}
		o := firstReadOutcome{rev: resp.Header.Revision, resps: make([]*clientv3.GetResponse, len(m.ops))}
		for j := range m.ops {
			rr := resp.Responses[i].GetResponseRange()
			i++
			if rr == nil && o.err == nil {
				o.err = fmt.Errorf("store: etcd answered a range with %T", resp.Responses[i-1].Response)
			}
			o.resps[j] = (*clientv3.GetResponse)(rr)
		}
		s.stats.countRead(o.resps...)
		m.done <- o
	}
}
