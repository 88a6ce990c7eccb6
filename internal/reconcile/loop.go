package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
)

// Config is what a Loop reconciles and how it learns what to look at.
type Config struct {
	// Name names the loop in logs ("terminations", "rollouts").
	Name  string
	Store store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Watch lists the store prefixes whose changes may move some key.
	Watch [][]byte
	// Scan lists every key that may need work. The loop calls it when a
	// pass starts — after its watches are established, before it reads
	// their first event, so nothing committed in between is missed — and
	// so again after a watch lagged or failed. Scan may rebuild whatever
	// Changed keeps.
	Scan func(ctx context.Context) ([]string, error)
	// Changed is called with each batch of watched changes (one committed
	// transaction) and kicks the keys it may move. It runs on the watches'
	// goroutines, one per prefix, concurrently with Reconcile.
	Changed func(batch []store.Event, kick func(key string))
	// Reconcile moves one key as far as it can go now and returns when to
	// look again (zero: when something changes). An error is logged and
	// the key retried after Retry, doubling up to MaxRetry.
	Reconcile func(ctx context.Context, key string) (time.Time, error)
	// Group, when set, names the group of a key (a termination's tree):
	// the keys ready at once are served a group at a time in turn, so one
	// group's many keys do not make another's wait behind them all. It is
	// called under the queue's lock, on whichever goroutine kicks the key
	// (a watch's, while Changed runs): it must be cheap and take no lock
	// that Changed may hold. Nil: one group, served in the order kicked.
	Group func(key string) string
	// Retry is the wait after a failed Reconcile (default one second);
	// MaxRetry bounds the doubling (default Retry: no doubling).
	Retry, MaxRetry time.Duration
}

// Loop is one reconcile loop: a keyed work queue with deduplication, store
// watches that kick keys, a rescan of everything when a watch lagged or
// failed, and a wake-up time per key on the Clock. See the package doc for
// the caller's duties.
type Loop struct {
	cfg Config
	q   *queue
}

// New returns a loop; Run runs it.
func New(cfg Config) *Loop {
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	cfg.MaxRetry = max(cfg.MaxRetry, cfg.Retry)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Changed == nil {
		cfg.Changed = func([]store.Event, func(string)) {}
	}
	return &Loop{cfg: cfg, q: newQueue(cfg.Group)}
}

// Kick asks the loop to reconcile key now. It never blocks, and a key
// kicked while Run is not running is reconciled when it runs.
func (l *Loop) Kick(key string) { l.q.add(key) }

// Run reconciles until ctx ends, and returns the context's error then. A
// watch that lagged or failed, or a failed Scan, costs a rescan (after a
// backoff when it was not a lag); it never ends Run.
func (l *Loop) Run(ctx context.Context) error {
	return Passes(ctx, l.cfg.Name, l.cfg.Clock, l.cfg.Log, l.pass)
}

// pass runs until ctx ends or a watch ends.
func (l *Loop) pass(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // the watches' goroutines end with ctx
	defer cancel()
	watches := make([]store.Watcher, 0, len(l.cfg.Watch))
	for _, prefix := range l.cfg.Watch {
		w, err := l.cfg.Store.Watch(ctx, prefix)
		if err != nil {
			return err
		}
		watches = append(watches, w)
	}
	keys, err := l.cfg.Scan(ctx)
	if err != nil {
		return err
	}
	for _, k := range keys {
		l.q.add(k)
	}
	ended := make(chan error, len(watches))
	for _, w := range watches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range w.Events() {
				l.cfg.Changed(batch, l.q.add)
			}
			ended <- WatchEnded(w)
		}()
	}
	c := l.cfg.Clock
	for {
		next := l.q.promote(c.Now())
		if key := l.q.take(); key != "" {
			if err := l.reconcile(ctx, key); err != nil {
				return err
			}
			continue
		}
		// One timer per wait, stopped when the wait ends. It is armed for
		// what is left until the next wake-up; if the clock passed that
		// while it was armed, the wake-up is due and there is no waiting.
		var timer clock.Timer
		var fired <-chan time.Time
		if !next.IsZero() {
			timer = clock.NewTimerAt(c, next)
			fired = timer.C()
			if !c.Now().Before(next) {
				timer.Stop()
				continue
			}
		}
		var err error
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case err = <-ended:
		case <-l.q.signal:
		case <-fired:
		}
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// reconcile runs Reconcile for one key and schedules its wake-up, or its
// retry; it returns an error only when ctx ended.
func (l *Loop) reconcile(ctx context.Context, key string) error {
	defer l.q.done(key)
	wake, err := l.cfg.Reconcile(ctx, key)
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		delay := l.retryAfter(l.q.failed(key))
		l.cfg.Log.Warn(l.cfg.Name+": reconcile failed; retrying", "key", key, "retry_in", delay, "error", err)
		wake = l.cfg.Clock.Now().Add(delay)
	default:
		l.q.succeeded(key)
	}
	l.q.wakeAt(key, wake)
	return nil
}

func (l *Loop) retryAfter(failures int) time.Duration {
	d := l.cfg.Retry
	for i := 1; i < failures && d < l.cfg.MaxRetry; i++ {
		d *= 2
	}
	return min(d, l.cfg.MaxRetry)
}

// WatchEnded is the error a pass returns when the watch w ended while its
// context had not: w's error, or ErrWatchLagged when it gave none (a watch
// must not end silently).
func WatchEnded(w store.Watcher) error {
	if err := w.Err(); err != nil {
		if errors.Is(err, store.ErrWatchLagged) {
			return err
		}
		return errors.Join(errWatchFailed, err)
	}
	return store.ErrWatchLagged
}

var errWatchFailed = errors.New("reconcile: watch failed")
