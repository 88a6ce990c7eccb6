package agentsdk

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/tokencache"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// HoldExitSentUntilTheSessionEnds makes a session's writer, once it has
// sent the exit message, wait (at most a minute) for the session to end
// before it notes the message sent: the session's clean end after the
// claim always comes first. It returns the function that undoes it.
func HoldExitSentUntilTheSessionEnds() (undo func()) {
	hold := func(session context.Context) {
		select {
		case <-session.Done():
		case <-time.After(time.Minute):
		}
	}
	afterExitSent.Store(&hold)
	return func() { afterExitSent.Store(nil) }
}

// CloseDuringTheNextSend makes the worker's next send, once it has found
// the worker open and before it sends, call w.Close on a goroutine of its
// own and wait until that Close returns or waits for the send itself.
// closedFirst then reports whether Close had returned before the send
// went out. It returns the function that undoes it.
func CloseDuringTheNextSend(w *LeaseWorker) (closedFirst func() bool, undo func()) {
	var once sync.Once
	var first atomic.Bool
	waiting := make(chan struct{})
	afterOpen := func(sender *LeaseWorker) {
		if sender != w {
			return
		}
		once.Do(func() {
			returned := make(chan struct{})
			go func() { _ = w.Close(); close(returned) }()
			select {
			case <-returned:
				first.Store(true)
			case <-waiting:
			case <-time.After(time.Minute):
			}
		})
	}
	beforeWait := func(closing *LeaseWorker) {
		if closing == w {
			close(waiting)
		}
	}
	afterOpenCheck.Store(&afterOpen)
	beforeCloseWaitsForSends.Store(&beforeWait)
	return first.Load, func() { afterOpenCheck.Store(nil); beforeCloseWaitsForSends.Store(nil) }
}

// OnFeedMessage has v call f after it applies each revocation feed
// message, on Run's goroutine: a test checks what the verifier accepts
// between two messages of one answer.
func OnFeedMessage(v *Verifier, f func(*tetherv1.WatchRevocationsResponse)) { v.applied = f }

// RegisterAsTheSignalIsNoted makes a's next drain (abort false) or abort
// (true), once handle has noted it and released the agent's lock,
// register an OnDrain (OnAbort) callback and wait (at most a minute) for
// it to run. ranAfter receives, from that callback, whether Draining was
// closed (Context had ended) when it ran. It returns the function that
// undoes it.
func RegisterAsTheSignalIsNoted(a *Agent, abort bool) (ranAfter <-chan bool, undo func()) {
	out := make(chan bool, 1)
	var once sync.Once
	hook := func(noted *Agent, isAbort bool) {
		if noted != a || isAbort != abort {
			return
		}
		once.Do(func() {
			ran := make(chan struct{})
			f := func(Signal) {
				defer close(ran)
				if abort {
					out <- a.Context().Err() != nil
					return
				}
				select {
				case <-a.Draining():
					out <- true
				default:
					out <- false
				}
			}
			if abort {
				a.OnAbort(f)
			} else {
				a.OnDrain(f)
			}
			select {
			case <-ran:
			case <-time.After(time.Minute):
			}
		})
	}
	afterSignalNoted.Store(&hook)
	return out, func() { afterSignalNoted.Store(nil) }
}

// SignalsOf sends every signal a's sessions read (once DrainDeadline took
// it in) on the channel it returns, dropping none the test has not read
// (the SDK waits). It returns the function that undoes it.
func SignalsOf(a *Agent) (<-chan Signal, func()) {
	out := make(chan Signal)
	stop := make(chan struct{})
	hook := func(read *Agent, s Signal) {
		if read != a {
			return
		}
		select {
		case out <- s:
		case <-stop:
		}
	}
	onSignal.Store(&hook)
	var once sync.Once
	return out, func() { once.Do(func() { onSignal.Store(nil); close(stop) }) }
}

// WhenRunWaitsForAbortCallbacks calls f(a) when Run, for agent a, has
// noted the abort its refusal means and waits for the OnAbort callbacks
// still running. It returns the function that undoes it.
func WhenRunWaitsForAbortCallbacks(a *Agent, f func()) (undo func()) {
	hook := func(waiting *Agent) {
		if waiting == a {
			f()
		}
	}
	runWaitsForAbortCallbacks.Store(&hook)
	return func() { runWaitsForAbortCallbacks.Store(nil) }
}

// CachedToken reports whether v's cache holds token's claims.
func CachedToken(v *Verifier, token string) bool {
	if v.cache == nil {
		return false
	}
	v.cacheMu.RLock()
	defer v.cacheMu.RUnlock()
	_, ok := v.cache.Get(tokencache.Digest(token))
	return ok
}

// CachedBytes is what v's cache holds, in bytes: each entry's key (the
// token, or its digest) and the strings of its claims.
func CachedBytes(v *Verifier) int {
	if v.cache == nil {
		return 0
	}
	v.cacheMu.RLock()
	defer v.cacheMu.RUnlock()
	n := 0
	v.cache.Range(func(sum tokencache.Sum, c *capability.Claims) bool {
		n += len(sum) + claimBytes(*c)
		return true
	})
	return n
}

// HeldTombstoneBytes is what v's tombstone set holds of its tombstones'
// text, in bytes: each one's grant id, reason, holder and lineage.
func HeldTombstoneBytes(v *Verifier) (tombstones, bytes int) {
	for _, t := range v.tombstones.Tombstones() {
		tombstones++
		bytes += len(t.GrantID) + len(t.Reason) + len(t.Holder) + len(t.Lineage)
	}
	return tombstones, bytes
}

// SetCancelWatchRefresh sets how long a busy gate keeps a WatchCancels
// stream (CancelWatchRefresh) for the gates made from now on. It returns
// the function that undoes it.
func SetCancelWatchRefresh(d time.Duration) (undo func()) {
	was := cancelWatchRefresh.Swap(int64(d))
	return func() { cancelWatchRefresh.Store(was) }
}
