package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/store"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// etcdScanPage is how many keys one range request of a Scan fetches.
const etcdScanPage = 512

// mutation is the final state of one key after a transaction.
type mutation struct {
	key     []byte
	value   []byte
	deleted bool
}

// defaultWatchBuffer is the WatchBuffer used when EtcdOptions leaves it 0.
const defaultWatchBuffer = 1024

// etcdPrefetchOps bounds the ranges of one prefetch request (a read-only
// Txn; EtcdOptions.MaxTxnOps, the server's --max-txn-ops, bounds it too):
// a chunk of a termination (1,000 nodes) prefetches in one request.
// etcdPrefetchParallel bounds the requests of one prefetch in flight at
// once, for the prefetches larger than one request.
const (
	etcdPrefetchOps      = 1024
	etcdPrefetchParallel = 4
	// etcdDefaultMaxTxnOps is etcd's default --max-txn-ops: the bound
	// prefetches fall back to when a member refuses a larger one.
	etcdDefaultMaxTxnOps = 128
)

// Rough upper bounds of what one comparison or one write adds to a commit
// request beyond its key and value (protobuf tags, lengths, revisions).
const (
	etcdCompareOverhead = 24
	etcdOpOverhead      = 16
)

// etcdSnapshot reads the store at one revision. The first read is
// linearizable (it sees every commit acknowledged before it began) and
// fixes the revision; every later read is served at that revision, so
// what a View or an Update attempt reads is one consistent snapshot.
type etcdSnapshot struct {
	store *Etcd
	ctx   context.Context
	rev   int64 // 0 until the first read
	// revisionErr is the error of a Revision call that could not learn
	// the revision (Revision itself cannot return it).
	revisionErr error
	// lost is set when a read found the snapshot's revision compacted.
	lost error
	// prefetched holds range responses fetched ahead by prefetch, by the
	// request that will ask for them. They are served as often as asked
	// (all at the snapshot's revision, so the same answer), so that a
	// transaction that reads a range twice (two steps of a chunk each
	// listing the nodes' privileges) fetches it once; readers copy what
	// they hand out to be kept.
	prefetched map[etcdRange]*clientv3.GetResponse
}

// etcdRange is the shape of one range request: a point read (end empty,
// limit 0) or the first page of a scan.
type etcdRange struct {
	key, end string
	limit    int64
}

// read serves q from what prefetch fetched, or with its own request.
func (r *etcdSnapshot) read(q etcdRange) (*clientv3.GetResponse, error) {
	if resp, ok := r.prefetched[q]; ok {
		return resp, nil
	}
	var opts []clientv3.OpOption
	if q.end != "" {
		opts = append(opts, clientv3.WithRange(q.end))
	}
	if q.limit > 0 {
		opts = append(opts, clientv3.WithLimit(q.limit))
	}
	return r.get(q.key, opts...)
}

// prefetch fetches qs at the snapshot's revision in as few requests as
// etcd allows (one read-only Txn per etcdPrefetchOps ranges, a few of them
// in flight at once), so that the reads that follow are answered from
// memory instead of a round trip each. The answers are those the reads
// would have got: same revision, same ranges. A prefetch that is the
// snapshot's first read fixes its revision with its first request (a Txn
// is linearizable, as the first read must be), not with a read of its own.
func (r *etcdSnapshot) prefetch(qs []etcdRange) error {
	if r.lost != nil {
		return r.lost
	}
	if r.prefetched == nil {
		r.prefetched = make(map[etcdRange]*clientv3.GetResponse, len(qs))
	}
	// A set, not a scan of todo: a subtree's level can hold thousands.
	var todo []etcdRange
	seen := make(map[etcdRange]bool, len(qs))
	for _, q := range qs {
		if _, ok := r.prefetched[q]; !ok && !seen[q] {
			seen[q] = true
			todo = append(todo, q)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	chunk := max(1, min(r.store.opts.MaxTxnOps, int(r.store.prefetchOps.Load())))
	var parts [][]etcdRange
	for len(todo) > 0 {
		part := todo[:min(chunk, len(todo))]
		todo = todo[len(part):]
		parts = append(parts, part)
	}
	if r.rev == 0 || len(parts) == 1 {
		// The first part fixes the revision the others read at.
		if err := r.prefetchPart(parts[0]); err != nil {
			if r.smallerPrefetches(err, chunk) {
				return r.prefetch(qs)
			}
			return err
		}
		parts = parts[1:]
	}
	if len(parts) == 0 {
		return nil
	}
	// The parts read at one fixed revision, so their order does not
	// matter: a few at once.
	var mu sync.Mutex
	g, _ := errgroup.WithContext(r.ctx)
	g.SetLimit(etcdPrefetchParallel)
	answers := make([][]*clientv3.GetResponse, len(parts))
	for i, part := range parts {
		g.Go(func() error {
			resps, err := r.fetchPart(part)
			if err != nil {
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, rpctypes.ErrCompacted) && r.lost == nil {
					r.lost = fmt.Errorf("store: etcd compacted revision %d while a transaction was reading it: %w", r.rev, err)
				}
				return err
			}
			answers[i] = resps
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if r.lost != nil {
			return r.lost
		}
		if r.smallerPrefetches(err, chunk) {
			return r.prefetch(qs)
		}
		return r.store.readError(r.ctx, err)
	}
	for i, part := range parts {
		for j, q := range part {
			r.prefetched[q] = answers[i][j]
		}
	}
	return nil
}

// smallerPrefetches reports whether err is a server's refusal of a
// prefetch of chunk ranges as too many operations (a member started
// without the --max-txn-ops the store asks for) and, if so, makes the
// store's prefetches use etcd's default bound from now on.
func (r *etcdSnapshot) smallerPrefetches(err error, chunk int) bool {
	if chunk <= etcdDefaultMaxTxnOps || !errors.Is(err, rpctypes.ErrTooManyOps) {
		return false
	}
	r.store.prefetchOps.Store(etcdDefaultMaxTxnOps)
	return true
}

// prefetchPart fetches one part of a prefetch and keeps its answers; at
// revision 0 it reads at the newest revision and fixes the snapshot's.
func (r *etcdSnapshot) prefetchPart(part []etcdRange) error {
	resps, err := r.fetchPart(part)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			r.lost = fmt.Errorf("store: etcd compacted revision %d while a transaction was reading it: %w", r.rev, err)
			return r.lost
		}
		return r.store.readError(r.ctx, err)
	}
	for j, q := range part {
		r.prefetched[q] = resps[j]
	}
	return nil
}

// fetchPart reads the ranges of part in one read-only Txn, at the
// snapshot's revision (at the newest when it has none yet, which it then
// fixes: only prefetchPart calls it so). It changes nothing else.
func (r *etcdSnapshot) fetchPart(part []etcdRange) ([]*clientv3.GetResponse, error) {
	ops := make([]clientv3.Op, len(part))
	for i, q := range part {
		var opts []clientv3.OpOption
		if r.rev != 0 {
			opts = append(opts, clientv3.WithRev(r.rev))
		}
		if q.end != "" {
			opts = append(opts, clientv3.WithRange(q.end))
		}
		if q.limit > 0 {
			opts = append(opts, clientv3.WithLimit(q.limit))
		}
		ops[i] = clientv3.OpGet(q.key, opts...)
	}
	if r.rev == 0 && len(ops) <= groupMaxReadOps {
		// The snapshot's first read: merged with others' (etcd_group.go).
		return r.firstRead(ops)
	}
	r.store.stats.reads.Add(1)
	resp, err := r.store.client.Txn(r.ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != len(part) {
		return nil, fmt.Errorf("store: etcd answered %d of %d prefetched ranges", len(resp.Responses), len(part))
	}
	out := make([]*clientv3.GetResponse, len(part))
	for i := range part {
		rr := resp.Responses[i].GetResponseRange()
		if rr == nil {
			return nil, fmt.Errorf("store: etcd answered a prefetched range with %T", resp.Responses[i].Response)
		}
		out[i] = (*clientv3.GetResponse)(rr)
	}
	r.store.stats.countRead(out...)
	if r.rev == 0 {
		r.rev = resp.Header.Revision
	}
	return out, nil
}

// prefetchRanges turns a Prefetch call's keys and prefixes (checked by
// Prefetch) into the range requests Get and Scan will make for them.
func (r *etcdSnapshot) prefetchRanges(keys, prefixes [][]byte) []etcdRange {
	qs := make([]etcdRange, 0, len(keys)+len(prefixes))
	for _, k := range keys {
		qs = append(qs, etcdRange{key: r.store.keys.key(k)})
	}
	for _, p := range prefixes {
		if sp := r.store.keys.span(p, store.ScanLowerBound(p, nil)); !sp.empty() {
			qs = append(qs, etcdRange{key: sp.from, end: sp.to, limit: etcdScanPage})
		}
	}
	return qs
}

// scanRanges turns a PrefetchScansFrom call's scans (checked by it) into
// the range requests of their first pages, as scan will make them.
func (r *etcdSnapshot) scanRanges(scans []store.ScanFrom) []etcdRange {
	qs := make([]etcdRange, 0, len(scans))
	for _, sc := range scans {
		if sp := r.store.keys.span(sc.Prefix, store.ScanLowerBound(sc.Prefix, sc.Start)); !sp.empty() {
			qs = append(qs, etcdRange{key: sp.from, end: sp.to, limit: etcdScanPage})
		}
	}
	return qs
}

// get runs a range request at the snapshot's revision.
func (r *etcdSnapshot) get(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if r.rev == 0 {
		// The snapshot's first read: merged with others' (etcd_group.go).
		resps, err := r.firstRead([]clientv3.Op{clientv3.OpGet(key, opts...)})
		if err != nil {
			return nil, r.store.readError(r.ctx, err)
		}
		return resps[0], nil
	}
	opts = append(opts, clientv3.WithRev(r.rev))
	r.store.stats.reads.Add(1)
	resp, err := r.store.client.Get(r.ctx, key, opts...)
	if err != nil {
		if r.rev != 0 && errors.Is(err, rpctypes.ErrCompacted) {
			r.lost = fmt.Errorf("store: etcd compacted revision %d while a transaction was reading it: %w", r.rev, err)
			return nil, r.lost
		}
		return nil, r.store.readError(r.ctx, err)
	}
	r.store.stats.countRead(resp)
	if r.rev == 0 {
		r.rev = resp.Header.Revision
	}
	return resp, nil
}

// revision fixes the snapshot's revision if no read has yet.
func (r *etcdSnapshot) revision() uint64 {
	if r.rev == 0 {
		if _, err := r.get(r.store.keys.revisionProbe(), clientv3.WithCountOnly()); err != nil {
			r.revisionErr = fmt.Errorf("store: read the revision: %w", err)
		}
	}
	return uint64(r.rev)
}

// getKey returns the committed key-value of an etcd key, nil if absent.
func (r *etcdSnapshot) getKey(key string) (*mvccpb.KeyValue, error) {
	resp, err := r.read(etcdRange{key: key})
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0], nil
}

// scan visits, in key order, the committed keys of sp merged with overlay:
// the transaction's own writes in sp, sorted by key, which replace (or,
// when deleted, hide) the committed key they equal. observe, if not nil,
// sees each committed key-value before it is passed to fn. scan returns the
// last key passed to fn (nil if none) and whether it went through all of
// sp.
func (r *etcdSnapshot) scan(sp etcdSpan, overlay []mutation, observe func(*mvccpb.KeyValue), fn func(key, value []byte) error) (last []byte, complete bool, err error) {
	// yield passes one entry to fn; stop reports that the scan ends here.
	yield := func(key, value []byte) (stop bool, err error) {
		last = key
		// Full slice expressions: an append by fn must not write into
		// memory the store still uses.
		err = fn(key[:len(key):len(key)], value[:len(value):len(value)])
		if errors.Is(err, store.ErrStopScan) {
			return true, nil
		}
		return err != nil, err
	}
	next := 0
	// yieldOverlay passes the overlay entries before key (all of them
	// when key is nil).
	yieldOverlay := func(key []byte) (stop bool, err error) {
		for ; next < len(overlay) && (key == nil || bytes.Compare(overlay[next].key, key) < 0); next++ {
			if m := overlay[next]; !m.deleted {
				if stop, err := yield(m.key, m.value); stop {
					next++
					return true, err
				}
			}
		}
		return false, nil
	}

	// The first page is read to the span's end (what a prefetch fetched,
	// and, for the few keys most scans visit, the only request). A range
	// request costs etcd as much as the keys in its range, however few it
	// returns, so the pages after it read slices of the rest instead
	// (etcdSlices): a scan of n keys then costs O(n), not O(n²/page).
	from, end := sp.from, sp.to
	var slices etcdSlices
	for from < sp.to {
		resp, err := r.read(etcdRange{key: from, end: end, limit: etcdScanPage})
		if err != nil {
			return last, false, err
		}
		for _, kv := range resp.Kvs {
			key := r.store.keys.callerKey(kv.Key)
			if stop, err := yieldOverlay(key); stop {
				return last, false, err
			}
			if next < len(overlay) && bytes.Equal(overlay[next].key, key) {
				// The transaction's own write replaces the committed key.
				m := overlay[next]
				next++
				if m.deleted {
					continue
				}
				if stop, err := yield(m.key, m.value); stop {
					return last, false, err
				}
				continue
			}
			if observe != nil {
				observe(kv)
			}
			if stop, err := yield(key, kv.Value); stop {
				return last, false, err
			}
		}
		from, end = slices.next(resp, from, end, sp.to)
	}
	if stop, err := yieldOverlay(nil); stop {
		return last, false, err
	}
	return last, true, nil
}

// etcdSlices chooses the ranges of a scan's pages after the first: the
// keys from the position reached that share its first depth bytes, up to
// the span's end. depth adapts to the keys: the first page's keys fix it
// (the bytes its first and last keys share: a slice then holds about a
// page, or a few dozen pages), a range counted at more than 8 pages (etcd
// counts the keys of every range it reads) narrows the next by a byte,
// and a slice with few keys widens it by one, so the gaps
// between the bytes keys use cost a request each, not one per byte value;
// after an empty slice the next request reads to the span's end, and the
// page it returns fixes the depth again.
// The slices tile the span in key order: a scan visits the same keys.
type etcdSlices struct {
	depth   int
	started bool
}

// next returns the range of the request after resp, the answer to the
// range [from, end) of a span ending at to; from == to when the span is
// done.
func (s *etcdSlices) next(resp *clientv3.GetResponse, from, end, to string) (string, string) {
	first := !s.started
	s.started = true
	n := len(resp.Kvs)
	switch {
	case resp.More && n > 0:
		// More keys in [from, end): go on after the last.
		lastKey := resp.Kvs[n-1].Key
		if first {
			s.depth = commonPrefixLen(string(resp.Kvs[0].Key), string(lastKey))
		} else if resp.Count > 8*etcdScanPage {
			s.depth++
		}
		from = string(lastKey) + "\x00"
	case end >= to:
		return to, to
	case n == 0:
		// An empty slice: the keys left, if any, lie further on. One
		// request to the span's end finds them (or that there are none:
		// where most scans that outrun their first page end), and their
		// page fixes the slices' depth again, as the first page did —
		// instead of a request per byte of depth given up.
		s.started = false
		return end, to
	default:
		// The slice is done: on to the next.
		if n < etcdScanPage/8 && s.depth > 0 {
			s.depth--
		}
		from = end
	}
	return from, sliceEnd(from, s.depth, to)
}

// sliceEnd is the end of the slice at from: the first key after those that
// share from's first depth bytes, or to if that is sooner.
func sliceEnd(from string, depth int, to string) string {
	end := prefixEnd([]byte(from[:min(depth, len(from))]))
	if end == nil || string(end) >= to {
		return to
	}
	return string(end)
}

// commonPrefixLen is the length of the longest common prefix of a and b.
func commonPrefixLen(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// etcdReadTxn is the ReadTxn of View.
type etcdReadTxn struct {
	snap     etcdSnapshot
	finished bool
}

func (t *etcdReadTxn) Get(key []byte) ([]byte, error) {
	if t.finished {
		return nil, store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return nil, err
	}
	kv, err := t.snap.getKey(t.snap.store.keys.key(key))
	switch {
	case err != nil:
		return nil, err
	case kv == nil:
		return nil, store.ErrNotFound
	}
	// A prefetched response may be served again: the caller gets a copy.
	if kv.Value == nil {
		return []byte{}, nil
	}
	return bytes.Clone(kv.Value), nil
}

func (t *etcdReadTxn) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	if err := store.CheckPrefix(prefix); err != nil {
		return err
	}
	sp := t.snap.store.keys.span(prefix, store.ScanLowerBound(prefix, start))
	_, _, err := t.snap.scan(sp, nil, nil, fn)
	return err
}

func (t *etcdReadTxn) Prefetch(keys, prefixes [][]byte) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(t.snap.prefetchRanges(keys, prefixes))
}

func (t *etcdReadTxn) PrefetchScansFrom(scans []store.ScanFrom) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(t.snap.scanRanges(scans))
}

// PrefetchReads fetches keys and the first page of each scan together.
func (t *etcdReadTxn) PrefetchReads(keys [][]byte, scans []store.ScanFrom) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(append(t.snap.prefetchRanges(keys, nil), t.snap.scanRanges(scans)...))
}

// Revision is the etcd revision the View reads at. Called before any read,
// it fixes the snapshot at the newest revision.
func (t *etcdReadTxn) Revision() uint64 {
	if t.finished {
		return uint64(t.snap.rev)
	}
	return t.snap.revision()
}

// etcdTxn is the Txn of one Update attempt: reads at a snapshot, writes
// buffered in memory, and a record of everything read, from which the
// commit's comparisons are built.
//
// Serializability: the commit applies the writes only if every key fn read
// still has the mod revision it had at the snapshot (0 for a key read as
// absent), and every range fn scanned holds no key modified after the
// snapshot. The first catches keys changed or deleted since; the second
// catches keys inserted into a scanned range (phantoms), and keys changed
// in it. If all hold, the state fn read is the state at the commit, so the
// transaction is equivalent to running fn at the commit's revision.
type etcdTxn struct {
	snap etcdSnapshot
	// reads are the committed keys fn observed, by etcd key.
	reads map[string]etcdRead
	// spans are the etcd ranges fn's scans covered, up to where each one
	// stopped.
	spans []etcdSpan
	// writes are the final state of each key written, by caller key.
	writes     map[string]mutation
	writeBytes int
	// expects are the comparisons Expect deferred to the commit, by etcd
	// key: the value the key must hold (nil: absent). deferExpect says
	// whether Expect may defer (the first attempt only: after a failed
	// commit, Expect reads, so that a false expectation is reported to fn
	// instead of failing every attempt).
	expects     map[string][]byte
	expectBytes int
	// expectRevs are the comparisons ExpectRevision deferred to the
	// commit, by etcd key: the mod revision the key must have.
	expectRevs  map[string]int64
	deferExpect bool
	finished    bool
}

// etcdRead is what fn learned about a committed key.
type etcdRead struct {
	modRevision int64 // 0: absent
	value       []byte
	valueKnown  bool // false for keys only seen by a scan
}

func newEtcdTxn(s *Etcd, ctx context.Context) *etcdTxn {
	return &etcdTxn{
		snap:   etcdSnapshot{store: s, ctx: ctx},
		reads:  make(map[string]etcdRead),
		writes: make(map[string]mutation),
	}
}

func (t *etcdTxn) Revision() uint64 {
	if t.finished {
		return uint64(t.snap.rev)
	}
	return t.snap.revision()
}

func (t *etcdTxn) Get(key []byte) ([]byte, error) {
	if t.finished {
		return nil, store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return nil, err
	}
	if m, ok := t.writes[string(key)]; ok {
		if m.deleted {
			return nil, store.ErrNotFound
		}
		return bytes.Clone(m.value), nil
	}
	etcdKey := t.snap.store.keys.key(key)
	r, ok := t.reads[etcdKey]
	if !ok || !r.valueKnown {
		kv, err := t.snap.getKey(etcdKey)
		if err != nil {
			return nil, err
		}
		r = etcdRead{valueKnown: true}
		if kv != nil {
			r.modRevision = kv.ModRevision
			r.value = kv.Value
			if r.value == nil {
				r.value = []byte{}
			}
		}
		t.reads[etcdKey] = r
	}
	if r.modRevision == 0 {
		return nil, store.ErrNotFound
	}
	return bytes.Clone(r.value), nil
}

// Expect answers whether key holds want. On the first attempt of an Update
// it does not read a key fn has not read or written: it answers true and
// adds the comparison to the commit (Value(key) = want, or, for want nil,
// CreateRevision(key) = 0: absent), so the commit applies only if the key
// holds want when it commits. That is a read of the key at the commit's
// revision; every other read of fn is checked to be unchanged up to that
// revision, so fn still saw one state, and Updates stay serializable. If
// the comparison fails, the attempt is void like any conflict, and on the
// next attempt Expect reads.
func (t *etcdTxn) Expect(key, want []byte) (bool, error) {
	if t.finished {
		return false, store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return false, err
	}
	etcdKey := t.snap.store.keys.key(key)
	_, written := t.writes[string(key)]
	r, read := t.reads[etcdKey]
	prior, expected := t.expects[etcdKey]
	if !t.deferExpect || written || (read && r.valueKnown) || (expected && !sameExpectation(prior, want)) {
		v, err := t.Get(key)
		if errors.Is(err, store.ErrNotFound) {
			return want == nil, nil
		}
		if err != nil {
			return false, err
		}
		return want != nil && bytes.Equal(v, want), nil
	}
	if expected {
		return true, nil
	}
	cost := len(etcdKey) + len(want) + etcdCompareOverhead
	if t.expectBytes+cost > t.snap.store.opts.MaxRequestBytes {
		return false, fmt.Errorf("%w: the transaction's expectations exceed etcd's per-request limit of %d bytes (--max-request-bytes)",
			store.ErrTooLarge, t.snap.store.opts.MaxRequestBytes)
	}
	if t.expects == nil {
		t.expects = make(map[string][]byte)
	}
	if want != nil {
		want = bytes.Clone(want)
	}
	t.expects[etcdKey] = want
	t.expectBytes += cost
	return true, nil
}

// ExpectRevision answers whether key was last written at revision rev,
// deferring the comparison to the commit (ModRevision(key) = rev) on the
// first attempt like Expect; otherwise it reads the key.
func (t *etcdTxn) ExpectRevision(key []byte, rev uint64) (bool, error) {
	if t.finished {
		return false, store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return false, err
	}
	if rev == 0 || rev > math.MaxInt64 {
		return false, nil // no write has that revision
	}
	etcdKey := t.snap.store.keys.key(key)
	_, written := t.writes[string(key)]
	r, read := t.reads[etcdKey]
	prior, expected := t.expectRevs[etcdKey]
	_, expectedValue := t.expects[etcdKey]
	if !t.deferExpect || written || read || expectedValue || (expected && prior != int64(rev)) {
		if written {
			return false, nil // its revision is not known before the commit
		}
		if !read {
			if _, err := t.Get(key); err != nil && !errors.Is(err, store.ErrNotFound) {
				return false, err
			}
			r = t.reads[etcdKey]
		}
		return r.modRevision == int64(rev), nil
	}
	if expected {
		return true, nil
	}
	cost := len(etcdKey) + etcdCompareOverhead
	if t.expectBytes+cost > t.snap.store.opts.MaxRequestBytes {
		return false, fmt.Errorf("%w: the transaction's expectations exceed etcd's per-request limit of %d bytes (--max-request-bytes)",
			store.ErrTooLarge, t.snap.store.opts.MaxRequestBytes)
	}
	if t.expectRevs == nil {
		t.expectRevs = make(map[string]int64)
	}
	t.expectRevs[etcdKey] = int64(rev)
	t.expectBytes += cost
	return true, nil
}

// sameExpectation reports whether two Expect values ask for the same
// state (nil is absence, distinct from an empty value).
func sameExpectation(a, b []byte) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

// Prefetch fetches ahead what Get and Scan will read. Reads it records
// (for the commit's comparisons) are only those fn then makes: a key
// prefetched but never read guards nothing.
func (t *etcdTxn) Prefetch(keys, prefixes [][]byte) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(t.snap.prefetchRanges(t.unknown(keys), prefixes))
}

// unknown returns the keys whose values fn has neither written nor read
// already: the ones a prefetch still has to ask for.
func (t *etcdTxn) unknown(keys [][]byte) [][]byte {
	var wanted [][]byte
	for _, k := range keys {
		if _, written := t.writes[string(k)]; written {
			continue
		}
		if r, ok := t.reads[t.snap.store.keys.key(k)]; ok && r.valueKnown {
			continue
		}
		wanted = append(wanted, k)
	}
	return wanted
}

// PrefetchScansFrom fetches ahead the first page of each scan; like
// Prefetch it guards nothing until fn scans.
func (t *etcdTxn) PrefetchScansFrom(scans []store.ScanFrom) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(t.snap.scanRanges(scans))
}

// PrefetchReads fetches keys and the first page of each scan together;
// like Prefetch it guards nothing until fn reads, and skips the keys fn
// wrote or read already.
func (t *etcdTxn) PrefetchReads(keys [][]byte, scans []store.ScanFrom) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	return t.snap.prefetch(append(t.snap.prefetchRanges(t.unknown(keys), nil), t.snap.scanRanges(scans)...))
}

func (t *etcdTxn) Put(key, value []byte) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return err
	}
	if err := store.CheckValue(value); err != nil {
		return err
	}
	// Keep "present with an empty value" distinct from "absent".
	v := bytes.Clone(value)
	if v == nil {
		v = []byte{}
	}
	return t.record(mutation{key: bytes.Clone(key), value: v})
}

func (t *etcdTxn) Delete(key []byte) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	if err := store.CheckKey(key); err != nil {
		return err
	}
	return t.record(mutation{key: bytes.Clone(key), deleted: true})
}

// record adds m to the writes unless the commit would outgrow what one
// etcd request may carry: a transaction cannot be split without losing
// its atomicity.
func (t *etcdTxn) record(m mutation) error {
	opts := &t.snap.store.opts
	cost := t.writeBytes + writeCost(t.snap.store.keys, m)
	count := len(t.writes) + 1
	if old, ok := t.writes[string(m.key)]; ok {
		cost -= writeCost(t.snap.store.keys, old)
		count--
	}
	if count > opts.MaxTxnOps || cost > opts.MaxRequestBytes {
		return fmt.Errorf("%w: the transaction's writes exceed etcd's per-request limits of %d operations (--max-txn-ops) or %d bytes (--max-request-bytes)",
			store.ErrTooLarge, opts.MaxTxnOps, opts.MaxRequestBytes)
	}
	t.writes[string(m.key)] = m
	t.writeBytes = cost
	return nil
}

func writeCost(keys etcdKeyspace, m mutation) int {
	return len(keys.prefix) + len(m.key) + len(m.value) + etcdOpOverhead
}

func (t *etcdTxn) Scan(prefix, start []byte, fn func(key, value []byte) error) error {
	if t.finished {
		return store.ErrTxnFinished
	}
	if err := store.CheckPrefix(prefix); err != nil {
		return err
	}
	keys := t.snap.store.keys
	lower := store.ScanLowerBound(prefix, start)
	sp := keys.span(prefix, lower)
	// Writes made by fn during the scan are not visited: the overlay is
	// gathered up front.
	var overlay []mutation
	for _, m := range t.writes {
		if bytes.HasPrefix(m.key, prefix) && bytes.Compare(m.key, lower) >= 0 {
			overlay = append(overlay, m)
		}
	}
	slices.SortFunc(overlay, func(x, y mutation) int { return bytes.Compare(x.key, y.key) })

	last, complete, err := t.snap.scan(sp, overlay, t.observe, fn)
	// Protect what fn saw: the whole range, or up to and including the
	// last key it was given when it stopped early.
	covered := sp
	if !complete {
		covered.to = sp.from
		if last != nil {
			covered.to = keys.key(last) + "\x00"
		}
	}
	if !covered.empty() {
		t.spans = append(t.spans, covered)
	}
	return err
}

// observe records a committed key a scan passed to fn.
func (t *etcdTxn) observe(kv *mvccpb.KeyValue) {
	if _, ok := t.reads[string(kv.Key)]; !ok {
		t.reads[string(kv.Key)] = etcdRead{modRevision: kv.ModRevision}
	}
}

// commitRequest is one etcd Txn: If(compares...).Then(ops...).
type commitRequest struct {
	compares []clientv3.Cmp
	ops      []clientv3.Op
	bytes    int // an upper estimate of the request's size
}

// commitRequest builds the commit of the attempt's writes, guarded by
// comparisons that hold only if nothing it read has changed (see etcdTxn).
func (t *etcdTxn) commitRequest() (commitRequest, error) {
	opts := &t.snap.store.opts
	spans := mergeSpans(t.spans)
	req := commitRequest{bytes: t.writeBytes}
	for _, sp := range spans {
		req.compares = append(req.compares,
			clientv3.Compare(clientv3.ModRevision(sp.from), "<", t.snap.rev+1).WithRange(sp.to))
		req.bytes += len(sp.from) + len(sp.to) + etcdCompareOverhead
	}
	for key, r := range t.reads {
		if r.modRevision == 0 && covered(spans, key) {
			// Its absence is already guarded: a key created in a scanned
			// range fails the range's comparison.
			continue
		}
		// A key that was present also needs its own comparison, since a
		// deleted key no longer shows up in its range's.
		req.compares = append(req.compares, clientv3.Compare(clientv3.ModRevision(key), "=", r.modRevision))
		req.bytes += len(key) + etcdCompareOverhead
	}
	for key, want := range t.expects {
		if want == nil {
			// etcd fails every Value comparison on a missing key, so
			// absence is asked of the creation revision.
			req.compares = append(req.compares, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		} else {
			req.compares = append(req.compares, clientv3.Compare(clientv3.Value(key), "=", string(want)))
		}
	}
	for key, rev := range t.expectRevs {
		req.compares = append(req.compares, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
	}
	req.bytes += t.expectBytes
	if len(req.compares) > opts.MaxTxnOps {
		return req, fmt.Errorf("%w: the transaction read %d keys and ranges, each a comparison at commit; etcd allows %d (--max-txn-ops)",
			store.ErrTooLarge, len(req.compares), opts.MaxTxnOps)
	}
	if req.bytes > opts.MaxRequestBytes {
		return req, fmt.Errorf("%w: the transaction's writes and the comparisons of its reads need about %d bytes; etcd allows %d (--max-request-bytes)",
			store.ErrTooLarge, req.bytes, opts.MaxRequestBytes)
	}
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		m := t.writes[k]
		etcdKey := t.snap.store.keys.key(m.key)
		if m.deleted {
			req.ops = append(req.ops, clientv3.OpDelete(etcdKey))
		} else {
			req.ops = append(req.ops, clientv3.OpPut(etcdKey, string(m.value)))
		}
	}
	return req, nil
}

// mergeSpans sorts spans and merges those that overlap or touch.
func mergeSpans(spans []etcdSpan) []etcdSpan {
	if len(spans) < 2 {
		return spans
	}
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b etcdSpan) int { return strings.Compare(a.from, b.from) })
	out := spans[:1]
	for _, sp := range spans[1:] {
		last := &out[len(out)-1]
		if sp.from <= last.to {
			last.to = max(last.to, sp.to)
			continue
		}
		out = append(out, sp)
	}
	return out
}

// covered reports whether key lies in one of spans (sorted and merged).
func covered(spans []etcdSpan, key string) bool {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].to > key })
	return i < len(spans) && spans[i].contains(key)
}
