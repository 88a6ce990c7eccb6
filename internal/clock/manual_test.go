package clock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
)

var start = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// transcript records what happened, one line each, as offsets from start.
type transcript struct {
	t     *testing.T
	clk   *clock.Manual
	lines []string
}

func (tr *transcript) log(format string, args ...any) {
	tr.lines = append(tr.lines, fmt.Sprintf("%s ", tr.clk.Now().Sub(start))+fmt.Sprintf(format, args...))
}

// received logs what each channel holds now, without waiting.
func (tr *transcript) received(timers map[string]clock.Timer, names ...string) {
	for _, n := range names {
		select {
		case at := <-timers[n].C():
			tr.log("%s fired (sent %s)", n, at.Sub(start))
		default:
			tr.log("%s silent", n)
		}
	}
}

func (tr *transcript) want(want string) {
	tr.t.Helper()
	got := strings.Join(tr.lines, "\n")
	want = strings.TrimSpace(strings.ReplaceAll(want, "\t", ""))
	if got != want {
		tr.t.Fatalf("transcript:\n%s\n\nwant:\n%s", got, want)
	}
}

func TestManualTimersFireInDeadlineOrder(t *testing.T) {
	clk := clock.NewManual(start)
	tr := &transcript{t: t, clk: clk}
	for _, d := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second} {
		clk.AfterFunc(d, func() { tr.log("f%s", d) })
	}
	// Two due at one instant fire in the order they were armed.
	clk.AfterFunc(2*time.Second, func() { tr.log("g2s") })
	tr.log("advance 1500ms")
	clk.Advance(1500 * time.Millisecond)
	tr.log("advance 10s")
	clk.Advance(10 * time.Second)
	tr.log("done, %d pending", clk.Waiters())
	// The clock jumps, then the due timers fire in deadline order.
	tr.want(`
		0s advance 1500ms
		1.5s f1s
		1.5s advance 10s
		11.5s f2s
		11.5s g2s
		11.5s f3s
		11.5s done, 0 pending`)
}

func TestManualTimerStopAndReset(t *testing.T) {
	clk := clock.NewManual(start)
	tr := &transcript{t: t, clk: clk}
	timers := map[string]clock.Timer{
		"a": clk.NewTimer(time.Second),
		"b": clk.NewTimer(time.Second),
		"c": clk.NewTimer(5 * time.Second),
	}
	tr.log("stop a: %v", timers["a"].Stop())
	tr.log("stop a again: %v", timers["a"].Stop())
	clk.Advance(time.Second)
	tr.received(timers, "a", "b")
	// b fired and nobody received: Reset drains it, so the old value is
	// never seen.
	clk.Advance(time.Second)
	tr.log("reset c to 1s: %v", timers["c"].Reset(time.Second))
	tr.log("reset b to 2s: %v", timers["b"].Reset(2*time.Second))
	clk.Advance(time.Second)
	tr.received(timers, "b", "c")
	clk.Advance(time.Second)
	tr.received(timers, "b", "c")
	// A timer reset to a time already past fires at once.
	tr.log("reset a to 0: %v", timers["a"].Reset(0))
	tr.received(timers, "a")
	tr.want(`
		0s stop a: true
		0s stop a again: false
		1s a silent
		1s b fired (sent 1s)
		2s reset c to 1s: true
		2s reset b to 2s: false
		3s b silent
		3s c fired (sent 3s)
		4s b fired (sent 4s)
		4s c silent
		4s reset a to 0: false
		4s a fired (sent 4s)`)
}

func TestManualResetDrainsAFiredValue(t *testing.T) {
	clk := clock.NewManual(start)
	tm := clk.NewTimer(time.Second)
	clk.Advance(time.Second) // fired, not received
	if tm.Reset(time.Minute) {
		t.Fatal("Reset of a fired timer reported it pending")
	}
	select {
	case <-tm.C():
		t.Fatal("a value sent before Reset was received after it")
	default:
	}
	clk.Advance(time.Minute)
	select {
	case <-tm.C():
	default:
		t.Fatal("the reset timer did not fire at its new deadline")
	}
}

func TestManualPeriodicWorkerRunsOncePerMove(t *testing.T) {
	clk := clock.NewManual(start)
	tr := &transcript{t: t, clk: clk}
	// A worker that re-arms itself every second, as a periodic one does:
	// a move past several periods runs it once (a ticker drops the ticks
	// its receiver missed), and it runs again a period after that.
	var tick func()
	tick = func() {
		tr.log("tick")
		clk.AfterFunc(time.Second, tick)
	}
	clk.AfterFunc(time.Second, tick)
	stopped := clk.AfterFunc(2500*time.Millisecond, func() { tr.log("never") })
	tr.log("stopped: %v", stopped.Stop())
	clk.Advance(time.Hour)
	clk.Advance(999 * time.Millisecond)
	tr.log("pending %d", clk.Waiters())
	clk.Advance(time.Millisecond)
	tr.want(`
		0s stopped: true
		1h0m0s tick
		1h0m0.999s pending 1
		1h0m1s tick`)
}

func TestManualSetBackFiresNothing(t *testing.T) {
	clk := clock.NewManual(start)
	fired := 0
	clk.AfterFunc(time.Second, func() { fired++ })
	clk.Set(start.Add(-time.Hour))
	if fired != 0 || clk.Waiters() != 1 {
		t.Fatalf("after moving back: fired %d, pending %d; want 0 and 1", fired, clk.Waiters())
	}
	clk.Set(start.Add(time.Second))
	if fired != 1 || clk.Waiters() != 0 {
		t.Fatalf("after reaching the deadline: fired %d, pending %d; want 1 and 0", fired, clk.Waiters())
	}
}

func TestManualSleep(t *testing.T) {
	clk := clock.NewManual(start)
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(context.Background(), clk, time.Minute) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal("the sleeper never armed its timer")
	}
	clk.Advance(59 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Sleep returned %v before its minute passed", err)
	default:
	}
	clk.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Sleep: %v", err)
	}
}

func TestManualSleepCancelledByContext(t *testing.T) {
	clk := clock.NewManual(start)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(ctx, clk, time.Hour) }()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := clk.BlockUntil(wait, 1); err != nil {
		t.Fatal("the sleeper never armed its timer")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep after cancel: %v, want context.Canceled", err)
	}
	// The cancelled sleep stopped its timer before returning.
	if n := clk.Waiters(); n != 0 {
		t.Fatalf("a cancelled Sleep left %d timers pending", n)
	}
}

func TestManualSleepThatIsAlreadyDue(t *testing.T) {
	clk := clock.NewManual(start)
	if err := clock.Sleep(context.Background(), clk, 0); err != nil {
		t.Fatal(err)
	}
	if err := clock.Sleep(context.Background(), clk, -time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestBlockUntilEndsWithItsContext(t *testing.T) {
	clk := clock.NewManual(start)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := clk.BlockUntil(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("BlockUntil with nothing armed and ctx ended: %v", err)
	}
}

func TestRealTimer(t *testing.T) {
	var c clock.Clock = clock.Real{}
	tm := c.NewTimer(0)
	<-tm.C()
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	<-done
	if tm := c.NewTimer(time.Hour); !tm.Stop() {
		t.Fatal("stopping a pending real timer reported it was not pending")
	}
}

// TestManualArmsAtTheMomentWhateverItReads: NewTimerAt and AfterFuncAt arm
// a Manual's timer for the moment given, not for the time left as the
// caller read the clock: a clock moved between a worker's reading and its
// arming (a test's Set) does not make it late, one already past the moment
// fires at once, and clock.NewTimerAt and clock.AfterFuncAt reach them
// through the Clock interface.
func TestManualArmsAtTheMomentWhateverItReads(t *testing.T) {
	clk := clock.NewManual(start)
	var c clock.Clock = clk
	at := start.Add(10 * time.Second)
	read := clk.Now()
	clk.Advance(4 * time.Second) // between the worker's reading and its arming
	ran := make(chan time.Time, 2)
	tm := clock.NewTimerAt(c, at)
	clock.AfterFuncAt(c, at, func() { ran <- clk.Now() })
	// What arming for the time left as read would have done: due at 14s.
	late := clk.AfterFunc(at.Sub(read), func() { ran <- time.Time{} })
	defer late.Stop()
	clk.Set(at.Add(-time.Millisecond))
	select {
	case <-tm.C():
		t.Fatal("the timer fired before its moment")
	case <-ran:
		t.Fatal("the func ran before its moment")
	default:
	}
	clk.Set(at)
	select {
	case got := <-tm.C():
		if !got.Equal(at) {
			t.Fatalf("the timer sent %v, want %v", got.Sub(start), at.Sub(start))
		}
	default:
		t.Fatal("the timer armed for 10s did not fire at 10s after the clock moved as it armed")
	}
	select {
	case got := <-ran:
		if !got.Equal(at) {
			t.Fatalf("the func ran at %v, want at its moment, 10s (the time left as read armed it at 14s)", got.Sub(start))
		}
	default:
		t.Fatal("the func armed for 10s did not run at 10s after the clock moved as it armed")
	}

	// Past the moment already: the timer fires and the func runs at once.
	if got := <-clock.NewTimerAt(c, start).C(); !got.Equal(at) {
		t.Fatalf("a timer for a moment past sent %v, want the clock's reading", got.Sub(start))
	}
	done := make(chan struct{})
	clock.AfterFuncAt(c, start, func() { close(done) })
	<-done
	if got := clk.Waiters(); got != 1 { // the late one
		t.Fatalf("%d timers pending, want 1", got)
	}
}

// TestRealAfterFuncAt: on a clock without moments (Real), AfterFuncAt arms
// for the time left.
func TestRealAfterFuncAt(t *testing.T) {
	var c clock.Clock = clock.Real{}
	done := make(chan struct{})
	clock.AfterFuncAt(c, c.Now().Add(-time.Second), func() { close(done) })
	<-done
	if tm := clock.AfterFuncAt(c, c.Now().Add(time.Hour), func() {}); !tm.Stop() {
		t.Fatal("stopping a pending real AfterFuncAt reported it was not pending")
	}
}

// TestManualJumpsAsTheNextFuncArms: JumpAsNextFuncArms moves the clock as
// the next AfterFunc or AfterFuncAt is armed, once, before it is armed
// (so AfterFunc arms from the moved time, AfterFuncAt for its moment),
// and closes its channel once it is; a timer (NewTimer) does not take it.
func TestManualJumpsAsTheNextFuncArms(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := clock.NewManual(start)
	armed := m.JumpAsNextFuncArms(time.Minute)
	m.NewTimer(time.Hour).Stop()
	if !m.Now().Equal(start) {
		t.Fatalf("a timer's arming moved the clock to %v", m.Now())
	}
	select {
	case <-armed:
		t.Fatal("armed closed before a function was armed")
	default:
	}
	fired := make(chan time.Time, 2)
	m.AfterFunc(time.Second, func() { fired <- m.Now() })
	<-armed
	if got := m.Now(); !got.Equal(start.Add(time.Minute)) {
		t.Fatalf("the clock reads %v as the function is armed, want %v", got, start.Add(time.Minute))
	}
	m.AfterFuncAt(start.Add(2*time.Minute), func() { fired <- m.Now() })
	if got := m.Now(); !got.Equal(start.Add(time.Minute)) {
		t.Fatalf("a second function moved the clock to %v: the jump is once", got)
	}
	m.Advance(time.Second)
	if got := <-fired; !got.Equal(start.Add(time.Minute + time.Second)) {
		t.Fatalf("AfterFunc fired at %v, want a second after the jump", got)
	}
	m.Set(start.Add(2 * time.Minute))
	if got := <-fired; !got.Equal(start.Add(2 * time.Minute)) {
		t.Fatalf("AfterFuncAt fired at %v, want its moment", got)
	}
}
