package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/semaphore"
)

// Limits the etcd server must be configured with, and that the etcd
// backend enforces by default. etcd's own defaults (128 operations, 1.5 MiB
// per request) are far too small for the control plane, which marks a
// 10,000-node subtree in one transaction. Start every etcd member with
//
//	--max-txn-ops=65536 --max-request-bytes=16777216
//
// (see docs/etcd.md). An Update beyond them fails with ErrTooLarge.
const (
	// EtcdMaxTxnOps is the --max-txn-ops the backend expects: the most
	// writes, and separately the most comparisons, in one Update.
	EtcdMaxTxnOps = 65536
	// EtcdMaxRequestBytes is the --max-request-bytes the backend expects:
	// the largest commit request of one Update, in bytes.
	EtcdMaxRequestBytes = 16 << 20
)

// EtcdOptions configure an etcd store.
type EtcdOptions struct {
	// Endpoints are the client URLs of the etcd members, e.g.
	// "http://10.0.0.1:2379".
	Endpoints []string
	// Prefix namespaces every key of the store inside etcd, so that several
	// stores (or other applications) can share one cluster. Default
	// "/tether/". Two stores must not use prefixes where one starts with the
	// other.
	Prefix string
	// DialTimeout bounds connecting to etcd at open, and each attempt to
	// reconnect. Default 5s.
	DialTimeout time.Duration
	// TLS, when set, is used to connect to the members (https:// endpoints).
	TLS *tls.Config
	// Username and Password authenticate to etcd when it has auth enabled.
	Username, Password string
	// Logger receives the store's reports and the etcd client's warnings.
	// Nil means slog.Default().
	Logger *slog.Logger

	// MaxTxnOps is the server's --max-txn-ops; Updates that need more
	// writes or more comparisons fail with ErrTooLarge before reaching the
	// server. Default EtcdMaxTxnOps.
	MaxTxnOps int
	// MaxRequestBytes is the server's --max-request-bytes; Updates whose
	// commit would be larger fail with ErrTooLarge. Default
	// EtcdMaxRequestBytes.
	MaxRequestBytes int
	// MaxAttempts bounds how many times Update runs its function when
	// commits keep conflicting; then it returns an error wrapping
	// ErrConflict. Default 16.
	MaxAttempts int
	// CommitTimeout bounds one commit request. A commit is not cancelled
	// with its Update's context (once the function ran, Update reports the
	// commit's outcome, as on Badger), so this is what ends a commit to an
	// unreachable cluster. Default 30s.
	CommitTimeout time.Duration
	// WatchBuffer is how many committed transactions a watcher may have
	// unread before its watch ends with ErrWatchLagged. Default 1024.
	WatchBuffer int
}

const (
	defaultEtcdPrefix        = "/tether/"
	defaultEtcdDialTimeout   = 5 * time.Second
	defaultEtcdMaxAttempts   = 16
	defaultEtcdCommitTimeout = 30 * time.Second

	// optimisticAttempts is how many attempts of an Update run beside the
	// process's other Updates; later ones run alone (see Etcd.Update).
	// One: a conflict is rare unless a key is hot, and then taking turns
	// beats colliding again (measured: 64 goroutines incrementing one
	// counter finish in about half the time than with two).
	optimisticAttempts = 1
	// Backoff before attempt n (n >= 2) is uniform in
	// [0, min(retryBackoffMax, retryBackoffBase<<(n-2))).
	retryBackoffBase = 2 * time.Millisecond
	retryBackoffMax  = 100 * time.Millisecond
	// closeGrace is how long Close waits for running operations before it
	// abandons them.
	closeGrace = 10 * time.Second
	// grpcOverhead is added to MaxRequestBytes for the client's own send
	// limit: etcd accepts that much framing above --max-request-bytes.
	grpcOverhead = 512 << 10
)

// exclusiveWeight takes the whole gate: an Update holding it runs alone.
const exclusiveWeight = 1 << 30

// Etcd is the replicated Store backend: every key lives in an etcd cluster
// under a prefix, and Updates are optimistic transactions checked by
// revision when they commit. See the package documentation.
type Etcd struct {
	client *clientv3.Client
	keys   etcdKeyspace
	opts   EtcdOptions
	log    *slog.Logger

	// gate lets Updates run together on their optimistic attempts (weight
	// 1) and alone on later ones (exclusiveWeight), so that goroutines of
	// one process cannot starve each other's retries.
	gate *semaphore.Weighted

	// lifetime ends when Close abandons running operations; every read,
	// commit and watch is cancelled with it.
	lifetime context.Context
	abandon  context.CancelFunc

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup // Views and Updates running
	// prefixWatches are the etcd watches later Watches of their prefix
	// join (etcd_watch.go); allWatches every etcd watch open, and
	// watchRoutines their goroutines.
	prefixWatches map[string]*prefixWatch
	allWatches    map[*prefixWatch]struct{}
	watchRoutines sync.WaitGroup

	stats etcdCounters
	// group merges the commits of concurrent Updates, and reads the
	// first reads of concurrent snapshots (etcd_group.go).
	group mergeQueue[*groupMember]
	reads mergeQueue[*firstRead]
	// prefetchOps is how many ranges one prefetch request carries
	// (etcdPrefetchOps, or etcd's default bound after a member refused
	// that many).
	prefetchOps atomic.Int64
	// observers see each committed Update (metrics).
	observers store.CommitObservers

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Etcd)(nil)

// OpenEtcd connects to the etcd cluster at opts.Endpoints and checks that
// it answers a read within DialTimeout. The store owns the client and
// closes it on Close.
func OpenEtcd(ctx context.Context, opts EtcdOptions) (*Etcd, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("store: open etcd: no endpoints")
	}
	if opts.Prefix == "" {
		opts.Prefix = defaultEtcdPrefix
	}
	keys, err := newEtcdKeyspace(opts.Prefix)
	if err != nil {
		return nil, err
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = defaultEtcdDialTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = EtcdMaxTxnOps
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = EtcdMaxRequestBytes
	}
	if opts.MaxRequestBytes < store.MaxValueSize+store.MaxKeySize+1024 {
		return nil, fmt.Errorf("store: open etcd: MaxRequestBytes %d cannot carry one value of store.MaxValueSize", opts.MaxRequestBytes)
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = defaultEtcdMaxAttempts
	}
	if opts.CommitTimeout <= 0 {
		opts.CommitTimeout = defaultEtcdCommitTimeout
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = defaultWatchBuffer
	}

	client, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.DialTimeout,
		// Probe idle connections so that a dead member is noticed, and
		// the client fails over, within seconds.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: opts.DialTimeout,
		PermitWithoutStream:  true,
		MaxCallSendMsgSize:   opts.MaxRequestBytes + grpcOverhead,
		TLS:                  opts.TLS,
		Username:             opts.Username,
		Password:             opts.Password,
		Logger:               newEtcdClientLogger(opts.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("store: open etcd %v: %w", opts.Endpoints, err)
	}
	// The client connects lazily; one read proves the cluster is there,
	// has a leader, and lets us read our namespace.
	probeCtx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	_, err = client.Get(probeCtx, keys.revisionProbe(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("store: open etcd %v: no answer to a read within %v: %w", opts.Endpoints, opts.DialTimeout, err)
	}

	warnIfNotDurable(ctx, client, opts)

	lifetime, abandon := context.WithCancel(context.Background())
	s := &Etcd{
		client:        client,
		keys:          keys,
		opts:          opts,
		log:           opts.Logger,
		gate:          semaphore.NewWeighted(exclusiveWeight),
		lifetime:      lifetime,
		abandon:       abandon,
		prefixWatches: make(map[string]*prefixWatch),
		allWatches:    make(map[*prefixWatch]struct{}),
	}
	s.prefetchOps.Store(etcdPrefetchOps)
	return s, nil
}

// Client returns the store's etcd client, for what shares its cluster and
// connection (leader election). It is closed by Close.
func (s *Etcd) Client() *clientv3.Client { return s.client }

// MetadataPrefix returns the etcd key prefix under which the component
// called name may keep its own keys: inside the store's namespace, in the
// reserved part (first byte 0x00) that callers can neither read, write,
// scan nor watch. Leader elections live there.
func (s *Etcd) MetadataPrefix(name string) string { return s.keys.reserved(name) }

// ChecksRevisionsAtCommit reports that an Update's first attempt checks
// ExpectRevision inside its commit (store.RevisionChecker).
func (s *Etcd) ChecksRevisionsAtCommit() bool { return true }

// enter registers a View, Update or Watch, which calls s.active.Done when
// it returns, or says why it may not start: ctx ended, or the store is
// closed.
func (s *Etcd) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.active.Add(1)
	return nil
}

func (s *Etcd) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// operationContext is ctx, also cancelled when Close abandons running
// operations.
func (s *Etcd) operationContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.lifetime, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// View runs fn on a snapshot: the first read fixes the revision (the
// newest committed one, read linearizably), and every later read of fn is
// served at that revision.
func (s *Etcd) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.active.Done()
	opCtx, done := s.operationContext(ctx)
	defer done()
	tx := &etcdReadTxn{snap: etcdSnapshot{store: s, ctx: opCtx}}
	err := fn(tx)
	tx.finished = true
	if err == nil {
		// A failed Revision cannot return its error; the View does.
		err = tx.snap.revisionErr
	}
	return err
}

// Update runs fn as an optimistic transaction and commits its writes with
// one etcd Txn that checks, by revision, that nothing fn read has changed
// since the snapshot fn read (see etcdTxn). On a conflict it runs fn again
// on a fresh snapshot. The first attempt runs beside the process's other
// Updates; a retry runs alone — the process's other Updates wait for it —
// so that goroutines of one process never starve each other (a transaction
// that reads a lot is not starved by small writers; many goroutines
// incrementing one counter take turns instead of colliding). Only other
// processes (replicas) can still conflict with a retry; against them,
// attempts are spaced by a jittered, growing backoff. After MaxAttempts
// conflicts Update returns an error wrapping ErrConflict.
//
// If ctx ends before fn starts, or between attempts, Update returns ctx's
// error and nothing is written. Once fn has run, its commit is not
// cancelled with ctx (it is bounded by CommitTimeout), so Update reports
// whether the writes were applied. When Update returns nil the writes are
// committed by etcd, which acknowledges only once a quorum of members has
// them in its fsynced write-ahead log.
func (s *Etcd) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.active.Done()
	start := time.Now()
	ctx, span := store.StartUpdateSpan(ctx)
	var lastConflict error
	for attempt := 1; attempt <= s.opts.MaxAttempts; attempt++ {
		if attempt > 1 {
			if s.isClosed() {
				return fmt.Errorf("%w: while retrying a conflicting Update", store.ErrClosed)
			}
			if err := clock.Sleep(ctx, clock.Real{}, retryBackoff(attempt)); err != nil {
				return err
			}
		}
		conflict, err := s.attemptInTurn(ctx, fn, attempt)
		if !conflict {
			if err == nil {
				s.stats.updates.Add(1)
				s.observers.Observe(1, time.Since(start))
			}
			store.EndSpan(span, err)
			return err
		}
		s.stats.conflicts.Add(1)
		lastConflict = err
	}
	err := fmt.Errorf("%w: gave up after %d attempts: %v", store.ErrConflict, s.opts.MaxAttempts, lastConflict)
	store.EndSpan(span, err)
	return err
}

// attemptInTurn waits for its turn at the gate — alone, or beside other
// shared attempts — then attempts.
func (s *Etcd) attemptInTurn(ctx context.Context, fn func(tx store.Txn) error, attempt int) (conflict bool, err error) {
	alone := attempt > optimisticAttempts
	weight := int64(1)
	if alone {
		weight = exclusiveWeight
	}
	s.stats.waiting.Add(1)
	err = s.gate.Acquire(ctx, weight)
	s.stats.waiting.Add(-1)
	if err != nil {
		return false, err
	}
	// Deferred: fn may end its goroutine (t.Fatal in a test) instead of
	// returning, and the gate must not stay taken.
	defer s.gate.Release(weight)
	s.stats.attempts.Add(1)
	if alone {
		s.stats.exclusive.Add(1)
	}
	return s.attempt(ctx, fn, attempt == 1)
}

// attempt runs fn once and commits its writes. conflict reports that the
// attempt was void and may be retried. On the first attempt, Expect defers
// its comparisons to the commit (see etcdTxn.Expect); later attempts read.
func (s *Etcd) attempt(ctx context.Context, fn func(tx store.Txn) error, first bool) (conflict bool, err error) {
	opCtx, done := s.operationContext(ctx)
	defer done()
	t := newEtcdTxn(s, opCtx)
	t.deferExpect = first
	err = store.RunUpdate(s.log, fn, t)
	t.finished = true
	if t.snap.lost != nil {
		// fn saw a read fail because its snapshot was compacted away;
		// whatever it concluded, the attempt is void.
		return true, t.snap.lost
	}
	if err == nil {
		err = t.snap.revisionErr
	}
	if err != nil || (len(t.writes) == 0 && len(t.expects) == 0 && len(t.expectRevs) == 0) {
		// A read-only Update is a consistent read at its snapshot and
		// needs no commit. (One that deferred an Expect commits no write
		// but its comparisons, which stand for the deferred read.)
		return false, err
	}
	return s.commit(t)
}

// commit commits the attempt's writes: merged with the commits of other
// Updates waiting meanwhile when it is small (etcd_group.go), alone when
// it is large.
func (s *Etcd) commit(t *etcdTxn) (conflict bool, err error) {
	req, err := t.commitRequest()
	if err != nil {
		return false, err
	}
	if !groupable(req) {
		return s.commitAlone(t, req)
	}
	return s.commitInGroup(newGroupMember(t, req))
}

// commitAlone sends req as a transaction of its own.
func (s *Etcd) commitAlone(t *etcdTxn, req commitRequest) (conflict bool, err error) {
	conflict, _, err = s.commitAloneAt(t, req)
	return conflict, err
}

// commitAloneAt is commitAlone that also returns the revision the commit
// was applied at (when it succeeded).
func (s *Etcd) commitAloneAt(t *etcdTxn, req commitRequest) (conflict bool, rev int64, err error) {
	ctx, cancel := s.commitContext()
	defer cancel()
	s.stats.commits.Add(1)
	s.stats.carried(req)
	resp, err := s.client.Txn(ctx).If(req.compares...).Then(req.ops...).Commit()
	if err != nil {
		return false, 0, s.commitError(err, req)
	}
	if !resp.Succeeded {
		return true, 0, conflictError(t)
	}
	return false, resp.Header.Revision, nil
}

// commitContext bounds one commit request: by CommitTimeout, and by Close
// abandoning running operations — not by the Update's context, since the
// Update reports the commit's outcome once its function ran.
func (s *Etcd) commitContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CommitTimeout)
	stop := context.AfterFunc(s.lifetime, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// conflictError is the error of an attempt whose commit's comparisons did
// not hold.
func conflictError(t *etcdTxn) error {
	if t.snap.rev == 0 {
		return fmt.Errorf("%w: a key did not hold the value an Expect asked for at the commit", store.ErrConflict)
	}
	return fmt.Errorf("%w: something read at revision %d changed, or an Expect did not hold, at the commit", store.ErrConflict, t.snap.rev)
}

// Close refuses new operations, lets running ones finish (abandoning them
// after closeGrace, when etcd is unreachable), ends every watch with
// ErrClosed and closes the client. Later calls return the first call's
// result. Close must not be called from inside a View or Update function.
func (s *Etcd) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()

		finished := make(chan struct{})
		go func() {
			s.active.Wait()
			close(finished)
		}()
		grace := time.NewTimer(closeGrace)
		select {
		case <-finished:
		case <-grace.C:
			s.log.Warn("store: etcd operations still running at close; abandoning them")
		}
		grace.Stop()
		s.abandon()
		<-finished

		// Abandoning cancelled every etcd watch; each goroutine ends its
		// Watches with ErrClosed.
		s.watchRoutines.Wait()
		if err := s.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
			s.closeErr = fmt.Errorf("store: close etcd client: %w", err)
		}
	})
	return s.closeErr
}

// EtcdStats are counters for watching optimistic transactions at work.
type EtcdStats struct {
	// Updates is the number of Updates that succeeded.
	Updates uint64
	// Attempts is the number of times an Update function ran.
	Attempts uint64
	// Conflicts is the number of attempts that lost a race and were retried
	// (or, after MaxAttempts, reported as ErrConflict).
	Conflicts uint64
	// Exclusive is the number of attempts that ran alone in this process
	// because earlier attempts of the same Update conflicted.
	Exclusive uint64
	// ReadRequests is the number of read requests sent to etcd by Views
	// and Update attempts (a prefetch of many reads is one).
	ReadRequests uint64
	// CommitRequests is the number of commit requests sent to etcd: one
	// per attempt that had something to commit, except that the commits
	// of concurrent Updates merged into one request count once.
	CommitRequests uint64
	// Merged is the number of Update attempts whose commit went merged
	// with others' (counted in CommitRequests once per merged request).
	Merged uint64
	// Doomed is the number of Update attempts whose commit was not sent:
	// it waited for a merged commit of this process that wrote what it
	// had read, and could only fail (answered a conflict at once; counted
	// in Conflicts too).
	Doomed uint64
	// Ranges is the number of ranges (point reads and scans' pages) the
	// read requests asked for, and KeysRead the keys they returned: the
	// volume of reading, where ReadRequests counts round trips.
	Ranges, KeysRead uint64
	// Compares and Writes are the comparisons and the writes (puts and
	// deletes) the commit requests carried, retried attempts included
	// (a doomed one carried none): the volume of committing.
	Compares, Writes uint64
	// WatchEvents is the number of events the store's etcd watches
	// received (a key written is received once per prefix watched that
	// holds it, however many Watches of that prefix are open).
	WatchEvents uint64
	// Waiting is the number of Updates waiting now for their turn: behind
	// a retry that runs alone, or, for a retry, for the others to finish.
	Waiting int
}

// Stats returns the store's counters.
func (s *Etcd) Stats() EtcdStats {
	return EtcdStats{
		Updates:        s.stats.updates.Load(),
		Attempts:       s.stats.attempts.Load(),
		Conflicts:      s.stats.conflicts.Load(),
		Exclusive:      s.stats.exclusive.Load(),
		ReadRequests:   s.stats.reads.Load(),
		CommitRequests: s.stats.commits.Load(),
		Merged:         s.stats.merged.Load(),
		Doomed:         s.stats.doomed.Load(),
		Ranges:         s.stats.ranges.Load(),
		KeysRead:       s.stats.keysRead.Load(),
		Compares:       s.stats.compares.Load(),
		Writes:         s.stats.writes.Load(),
		WatchEvents:    s.stats.watchEvents.Load(),
		Waiting:        int(s.stats.waiting.Load()),
	}
}

type etcdCounters struct {
	updates, attempts, conflicts, exclusive, reads, commits, merged atomic.Uint64
	doomed                                                          atomic.Uint64
	ranges, keysRead, compares, writes, watchEvents                 atomic.Uint64
	waiting                                                         atomic.Int64
}

// carried counts the comparisons and writes of req, sent in a commit
// request.
func (c *etcdCounters) carried(req commitRequest) {
	c.compares.Add(uint64(len(req.compares)))
	c.writes.Add(uint64(len(req.ops)))
}

// countRead counts the ranges of one read request and the keys it
// returned.
func (c *etcdCounters) countRead(resps ...*clientv3.GetResponse) {
	n := 0
	for _, r := range resps {
		if r != nil {
			n += len(r.Kvs)
		}
	}
	c.ranges.Add(uint64(len(resps)))
	c.keysRead.Add(uint64(n))
}

// retryBackoff is the wait before attempt n: full jitter over an
// exponentially growing, capped window, so that replicas that conflicted
// with each other do not collide again in step.
func retryBackoff(attempt int) time.Duration {
	window := min(retryBackoffMax, retryBackoffBase<<min(attempt-2, 16))
	return rand.N(window)
}

// durableSince is, per minor release line, the first etcd release that
// persists a single member's writes before acknowledging them (etcd issue
// 14370: earlier ones could acknowledge a write a crash then lost).
var durableSince = map[string]int{"3.4": 21, "3.5": 5}

// warnIfNotDurable logs a warning when the first endpoint runs an etcd
// release that can acknowledge writes before they are durable.
func warnIfNotDurable(ctx context.Context, client *clientv3.Client, opts EtcdOptions) {
	statusCtx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	status, err := client.Status(statusCtx, opts.Endpoints[0])
	if err != nil {
		return // the first endpoint may be down; the others answered
	}
	var major, minor, patch int
	if _, err := fmt.Sscanf(status.Version, "%d.%d.%d", &major, &minor, &patch); err != nil {
		return
	}
	line := fmt.Sprintf("%d.%d", major, minor)
	if first, ok := durableSince[line]; (ok && patch < first) || major < 3 || (major == 3 && minor < 4) {
		opts.Logger.Warn("store: this etcd release can acknowledge writes of a single-member cluster before they are durable; use 3.4.21, 3.5.5 or later",
			"etcd_version", status.Version, "endpoint", opts.Endpoints[0])
	}
}

// ObserveCommits makes fn see every committed Update from now on (nil
// stops); with etcd each Update is reported on its own, also when its
// commit went merged with others' (etcd_group.go).
func (s *Etcd) ObserveCommits(fn store.CommitObserver) { s.observers.Set(fn) }
