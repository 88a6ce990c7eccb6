package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/reconcile"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// errDeadlineSettled ends a drainFollower's watch: the followed stop's
// deadline will not change any more.
var errDeadlineSettled = errors.New("controlplane: the stop's deadline is settled")

// drainFollower follows, for one signal stream (Session, WatchSignals),
// the stop whose drain signal the stream last sent, and wakes the stream
// when that stop's deadline (stopDeadline) is not the one the signal
// carried, so that the stream sends the drain signal again with it. A
// stop's deadline changes without its node changing: its request marks the
// root draining before its mark sets the drain deadline, and a drain that
// ends (at the mark, for a node with no call in flight) has its grants
// revoked and the confirmation deadline set, nothing written to the node.
// The node's signal, sent only as the node changes, told an agent that
// does not heartbeat (or before its next last-seen write) no deadline, or
// a rogue parent's day-long drain deadline while the record waited a
// minute for its exit (rogue38a test). The stop is followed by the
// supervisor's shared termination watch, only while its deadline may
// still change (before its grants are revoked). A watch that ends with an
// error (a lagging shared watch that could not be opened again, a failed
// read) is started again after a backoff on the clock (reconcile.Passes)
// while the stream follows that stop: until the fortieth pass the
// following simply ended, and a later change of the deadline was never
// sent on that stream (rogue40r test).
type drainFollower struct {
	sup  *supervisor.Supervisor
	ctx  context.Context
	clk  clock.Clock
	log  *slog.Logger
	wake chan struct{} // one pending: send the drain signal again

	mu     sync.Mutex
	last   *tree.SessionSignal // the last signal the stream sent
	id     string              // the stop followed ("": none)
	told   time.Time           // the deadline its last drain signal carried
	cancel context.CancelFunc
}

// signalsOut returns how a signal stream sends its signals: signal is
// signalOut, noting what it sent; on resend.wake the stream sends
// resend.again() (when not nil: the last drain signal, its stop's deadline
// changed) through signal; stop ends the following.
func (s *Server) signalsOut(ctx context.Context) (signal func(*tree.SessionSignal) *tetherv1.SessionSignal, resend *drainFollower, stop func()) {
	f := newDrainFollower(ctx, s.supervisor, s.cfg.Clock, s.log)
	return func(sig *tree.SessionSignal) *tetherv1.SessionSignal {
		out := s.signalOut(ctx, sig)
		var told time.Time
		if out.GetDeadline() != nil {
			told = out.GetDeadline().AsTime()
		}
		f.sent(sig, told)
		return out
	}, f, f.stop
}

// again is the drain signal to send again once wake fired, nil when the
// stream's last signal is no longer a drain (an abort came meanwhile).
func (f *drainFollower) again() *tree.SessionSignal {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil || f.last.Kind != tree.SignalKindDrain || f.last.TerminationID != f.id {
		return nil
	}
	return f.last
}

func newDrainFollower(ctx context.Context, sup *supervisor.Supervisor, clk clock.Clock, log *slog.Logger) *drainFollower {
	return &drainFollower{sup: sup, ctx: ctx, clk: clk, log: log, wake: make(chan struct{}, 1)}
}

// sent notes the signal the stream sent (sig as the node called for it,
// told the deadline it carried) and follows its stop: a drain's, while
// its deadline may change; nothing otherwise.
func (f *drainFollower) sent(sig *tree.SessionSignal, told time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = sig
	id := ""
	if sig != nil && sig.Kind == tree.SignalKindDrain {
		id = sig.TerminationID
	}
	f.told = told
	if id == f.id {
		return
	}
	if f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
	f.id = id
	if id == "" {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	f.cancel = cancel
	go reconcile.Passes(ctx, "drain signal follower", f.clk, f.log, func(ctx context.Context) error {
		err := f.sup.Watch(ctx, id, func(t supervisor.Termination) error {
			d := stopDeadline(t)
			f.mu.Lock()
			changed := f.id == id && !d.IsZero() && !d.Equal(f.told)
			f.mu.Unlock()
			if changed {
				select {
				case f.wake <- struct{}{}:
				default: // one is pending
				}
			}
			if t.Phase == supervisor.PhaseReconciling && t.Revoked || t.Phase == supervisor.PhaseAborting || t.Phase == supervisor.PhaseTerminated {
				return errDeadlineSettled
			}
			return nil
		})
		if err == nil || errors.Is(err, errDeadlineSettled) {
			// Settled, or terminated (Watch's own end): nothing to follow.
			return reconcile.Permanent(errDeadlineSettled)
		}
		return err
	})
}

// stop ends the following.
func (f *drainFollower) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
	f.id = ""
}
