package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
)

// Backoff bounds for a pass that failed other than by a lagged watch.
const (
	firstBackoff = time.Second
	maxBackoff   = time.Minute
)

// Passes runs pass again and again until ctx ends, and returns the
// context's error then. This is how every background worker treats the end
// of a pass: a watch that lagged (store.ErrWatchLagged) lost events, not
// state, so the next pass re-establishes the watches and rescans at once;
// any other error (a watch or a read that failed) is logged and the next
// pass starts after a backoff on c (one second, doubling to a minute, back
// to one second once a pass has run longer than that). Only an error
// wrapped with Permanent ends Passes before ctx does.
func Passes(ctx context.Context, name string, c clock.Clock, log *slog.Logger, pass func(context.Context) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := firstBackoff
	for {
		started := c.Now()
		err := pass(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var stop permanent
		switch {
		case errors.As(err, &stop):
			return stop.err
		case errors.Is(err, store.ErrWatchLagged):
			log.Warn(name+": a watch fell behind; rescanning", "error", err)
			continue
		}
		if c.Now().Sub(started) > maxBackoff {
			backoff = firstBackoff
		}
		if err == nil {
			err = errors.New("the pass ended without an error")
		}
		log.Warn(name+": pass failed; retrying", "retry_in", backoff, "error", err)
		if err := clock.Sleep(ctx, c, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Permanent wraps an error that must end Passes (an injected crash, say)
// rather than be retried.
func Permanent(err error) error { return permanent{err} }

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }
