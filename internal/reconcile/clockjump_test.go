package reconcile_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// jumpyClock moves its clock forward by step each time the loop arms a
// timer, once step is set: a test's Set landing between the loop's reading
// of the clock and its arming.
type jumpyClock struct {
	*clock.Manual
	mu   sync.Mutex
	step time.Duration
}

func (j *jumpyClock) jump() {
	j.mu.Lock()
	step := j.step
	j.mu.Unlock()
	if step > 0 {
		j.Manual.Advance(step)
	}
}

func (j *jumpyClock) NewTimer(d time.Duration) clock.Timer {
	j.jump()
	return j.Manual.NewTimer(d)
}

func (j *jumpyClock) NewTimerAt(t time.Time) clock.Timer {
	j.jump()
	return j.Manual.NewTimerAt(t)
}

// TestLoopWakesOnTimeWhenTheClockMovesAsItArms: the loop armed its timer
// for the time left until the next wake-up as it had read it, from what
// the clock read when it armed: a clock moved in between (a test setting
// it to a millisecond before the wake-up) armed the timer late by the
// move, and the key was not reconciled at its wake-up (CI:
// TestLoopRetriesAFailedKeyWithBackoffOnTheClock, "no reconcile; want
// "11s a""). It arms for the wake-up itself (clock.NewTimerAt).
func TestLoopWakesOnTimeWhenTheClockMovesAsItArms(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := &jumpyClock{Manual: clock.NewManual(start)}
	seen := make(chan time.Duration, 10)
	loop := reconcile.New(reconcile.Config{
		Name: "jumpy", Store: st, Clock: clk,
		Scan: func(context.Context) ([]string, error) { return []string{"a"}, nil },
		Reconcile: func(ctx context.Context, key string) (time.Time, error) {
			now := clk.Now()
			seen <- now.Sub(start)
			if now.Equal(start) {
				// Each arming of the loop's from now on moves the clock
				// a millisecond.
				clk.mu.Lock()
				clk.step = time.Millisecond
				clk.mu.Unlock()
				return start.Add(10 * time.Second), nil
			}
			return time.Time{}, nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run after cancel: %v", err)
		}
	})
	if got := <-seen; got != 0 {
		t.Fatalf("first reconcile at %v, want 0s", got)
	}
	armed, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	if err := clk.BlockUntil(armed, 1); err != nil {
		t.Fatal("the loop never armed its timer")
	}
	clk.Set(start.Add(10 * time.Second))
	select {
	case got := <-seen:
		if got < 10*time.Second {
			t.Fatalf("reconciled at %v, before its wake-up at 10s", got)
		}
	case <-time.After(20 * time.Second): // a guard, not a synchronisation
		t.Fatal("no reconcile at the wake-up: the loop armed its timer late by the clock's move")
	}
}
