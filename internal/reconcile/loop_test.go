package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

var start = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

const prefix = "items/"

// world is a loop over the items stored under items/: an item's value is
// "wait <duration>" (look again that much later), "fail" (Reconcile fails)
// or anything else (done). Each reconcile is reported on seen.
type world struct {
	t     *testing.T
	store *badgerstore.Badger
	clk   *clock.Manual
	loop  *reconcile.Loop
	seen  chan string
	scans chan struct{}
	gate  chan struct{} // an item "block" waits for it to close
	// hold, when set, blocks Changed (the watch is not read) until closed.
	mu   sync.Mutex
	hold chan struct{}
	// changed reports each key Changed kicked (the watch delivered it).
	changed chan string
}

func newWorld(t *testing.T, opts badgerstore.BadgerOptions) *world {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	w := &world{t: t, store: st, clk: clock.NewManual(start), seen: make(chan string, 100), scans: make(chan struct{}, 100), gate: make(chan struct{}), changed: make(chan string, 100)}
	w.loop = reconcile.New(reconcile.Config{
		Name: "items", Store: st, Clock: w.clk, Watch: [][]byte{[]byte(prefix)},
		Scan: func(ctx context.Context) ([]string, error) {
			var keys []string
			err := st.View(ctx, func(tx store.ReadTxn) error {
				return tx.Scan([]byte(prefix), nil, func(k, _ []byte) error {
					keys = append(keys, strings.TrimPrefix(string(k), prefix))
					return nil
				})
			})
			w.scans <- struct{}{}
			return keys, err
		},
		Changed: func(batch []store.Event, kick func(string)) {
			w.mu.Lock()
			hold := w.hold
			w.mu.Unlock()
			if hold != nil {
				<-hold
			}
			for _, ev := range batch {
				if ev.Type == store.EventPut {
					key := strings.TrimPrefix(string(ev.Key), prefix)
					kick(key)
					select {
					case w.changed <- key:
					default:
					}
				}
			}
		},
		Reconcile: func(ctx context.Context, key string) (time.Time, error) {
			var v []byte
			err := st.View(ctx, func(tx store.ReadTxn) error {
				var err error
				v, err = tx.Get([]byte(prefix + key))
				return err
			})
			if err != nil {
				return time.Time{}, err
			}
			w.seen <- fmt.Sprintf("%s %s", w.clk.Now().Sub(start), key)
			switch s := string(v); {
			case s == "block":
				<-w.gate
			case s == "fail":
				return time.Time{}, errors.New("refused")
			case strings.HasPrefix(s, "wait "):
				d, err := time.ParseDuration(strings.TrimPrefix(s, "wait "))
				if err != nil {
					return time.Time{}, err
				}
				return w.clk.Now().Add(d), nil
			}
			return time.Time{}, nil
		},
		Retry: time.Second, MaxRetry: 4 * time.Second,
	})
	return w
}

func (w *world) put(key, value string) {
	w.t.Helper()
	if err := w.store.Update(context.Background(), func(tx store.Txn) error {
		return tx.Put([]byte(prefix+key), []byte(value))
	}); err != nil {
		w.t.Fatal(err)
	}
}

// run starts the loop and stops it (checking it stopped cleanly) when the
// test ends.
func (w *world) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.loop.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			w.t.Errorf("Run after cancel: %v, want context.Canceled", err)
		}
	})
}

// expect waits for the next reconciles, in order.
func (w *world) expect(want ...string) {
	w.t.Helper()
	for _, x := range want {
		select {
		case got := <-w.seen:
			if got != x {
				w.t.Fatalf("reconciled %q, want %q", got, x)
			}
		case <-time.After(20 * time.Second): // a guard, not a synchronisation
			w.t.Fatalf("no reconcile; want %q", x)
		}
	}
}

// watched waits until the watch delivered a change of key to Changed.
func (w *world) watched(key string) {
	w.t.Helper()
	for {
		select {
		case got := <-w.changed:
			if got == key {
				return
			}
		case <-time.After(20 * time.Second): // a guard, not a synchronisation
			w.t.Fatalf("the watch never delivered %q", key)
		}
	}
}

// quiet checks nothing was reconciled: the loop is idle once the clock
// has a timer for the next wake-up and the queue is empty, so the test
// waits for that (the kick it made is taken) before looking.
func (w *world) quiet() {
	w.t.Helper()
	select {
	case got := <-w.seen:
		w.t.Fatalf("reconciled %q, want nothing", got)
	default:
	}
}

func (w *world) armed(n int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.clk.BlockUntil(ctx, n); err != nil {
		w.t.Fatalf("the loop never armed %d timers (%d pending)", n, w.clk.Waiters())
	}
}

func TestLoopResumesFromStoredStateAndWakesOnTheClock(t *testing.T) {
	w := newWorld(t, badgerstore.BadgerOptions{})
	w.put("a", "wait 10s")
	w.run()
	w.expect("0s a")
	w.armed(1)
	w.clk.Advance(9 * time.Second)
	w.quiet()
	w.clk.Advance(time.Second)
	w.expect("10s a")
	// A change kicks the key at once; its new wake-up replaces the old.
	w.put("a", "wait 1m")
	w.expect("10s a")
	w.armed(1)
	w.clk.Advance(30 * time.Second) // the old wake-up (20s) no longer counts
	w.quiet()
	w.clk.Advance(30 * time.Second)
	w.expect("1m10s a")
	w.put("a", "done")
	w.expect("1m10s a")
	w.clk.Advance(time.Hour)
	w.quiet()
}

func TestLoopWakesKeysInDeadlineOrder(t *testing.T) {
	w := newWorld(t, badgerstore.BadgerOptions{})
	w.put("late", "wait 3s")
	w.put("early", "wait 1s")
	w.put("middle", "wait 2s")
	w.run()
	for range 3 {
		<-w.seen // the first pass, in scan order
	}
	w.armed(1)
	// One move of the clock past all three: they run in deadline order.
	w.clk.Advance(3 * time.Second)
	w.expect("3s early", "3s middle", "3s late")
}

func TestLoopDeduplicatesKicks(t *testing.T) {
	w := newWorld(t, badgerstore.BadgerOptions{})
	w.put("a", "block")
	w.run()
	w.expect("0s a") // and a is being reconciled until the gate opens
	// Kicks of a key being reconciled make it run once more; kicks of a
	// key that waits coalesce.
	for range 10 {
		w.loop.Kick("a")
	}
	w.put("b", "done")
	w.watched("b") // the put's own kick is in, so it cannot come after b ran
	for range 10 {
		w.loop.Kick("b")
	}
	close(w.gate)
	w.expect("0s b", "0s a")
	w.put("c", "done")
	w.expect("0s c") // nothing else was queued before it
}

func TestLoopRetriesAFailedKeyWithBackoffOnTheClock(t *testing.T) {
	w := newWorld(t, badgerstore.BadgerOptions{})
	w.put("a", "fail")
	w.run()
	w.expect("0s a")
	// Retries after 1s, 2s, 4s, 4s (MaxRetry).
	for _, at := range []string{"1s", "3s", "7s", "11s"} {
		w.armed(1)
		d, _ := time.ParseDuration(at)
		w.clk.Set(start.Add(d - time.Millisecond))
		w.quiet()
		w.clk.Set(start.Add(d))
		w.expect(at + " a")
	}
	w.put("a", "done")
	w.expect("11s a")
	w.clk.Advance(time.Hour)
	w.quiet()
}

// TestLoopRescansAfterALaggedWatch: the watch falls behind while changes
// are committed (its buffer holds one transaction and nobody reads it);
// the loop re-establishes it and rescans, so every key is reconciled.
func TestLoopRescansAfterALaggedWatch(t *testing.T) {
	w := newWorld(t, badgerstore.BadgerOptions{WatchBuffer: 1})
	w.run()
	<-w.scans
	hold := make(chan struct{})
	w.mu.Lock()
	w.hold = hold
	w.mu.Unlock()
	w.put("a", "done") // taken by Changed, which holds
	for _, k := range []string{"b", "c", "d", "e"} {
		w.put(k, "done") // the watch's buffer overflows
	}
	w.mu.Lock()
	w.hold = nil
	w.mu.Unlock()
	close(hold)
	select {
	case <-w.scans:
	case <-time.After(20 * time.Second): // a guard
		t.Fatal("the loop did not rescan after its watch lagged")
	}
	got := map[string]bool{}
	for len(got) < 5 {
		select {
		case s := <-w.seen:
			got[strings.TrimPrefix(s, "0s ")] = true
		case <-time.After(20 * time.Second): // a guard
			t.Fatalf("after the rescan only %v were reconciled", got)
		}
	}
}

// TestPassesRetriesFailuresOnTheClock: a pass that fails other than by a
// lag is retried after a backoff on the clock, and only a Permanent error
// ends Passes before its context.
func TestPassesRetriesFailuresOnTheClock(t *testing.T) {
	clk := clock.NewManual(start)
	calls := make(chan int, 10)
	n := 0
	done := make(chan error, 1)
	go func() {
		done <- reconcile.Passes(context.Background(), "test", clk, nil, func(context.Context) error {
			n++
			calls <- n
			switch n {
			case 1:
				return store.ErrWatchLagged // rescanned at once
			case 2, 3:
				return errors.New("store unavailable")
			}
			return reconcile.Permanent(errors.New("crash"))
		})
	}()
	<-calls
	<-calls // the lag cost no wait
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, backoff := range []time.Duration{time.Second, 2 * time.Second} {
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatal("no backoff armed")
		}
		clk.Advance(backoff - time.Millisecond)
		select {
		case <-calls:
			t.Fatalf("retried before its %s backoff", backoff)
		default:
		}
		clk.Advance(time.Millisecond)
		<-calls
	}
	if err := <-done; err == nil || err.Error() != "crash" {
		t.Fatalf("Passes after a permanent error: %v, want crash", err)
	}
}
