package agentsdk

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// RetryPolicy is how a Conn retries a unary call the control plane
// refused resource_exhausted with a retry hint: a rate limit's refusal
// (its Retry-After header, in whole seconds, and its
// google.rpc.RetryInfo detail, to the millisecond), which the control
// plane answers before the call does anything, so that sending it again
// is safe. A refusal without a hint (a bound that time alone does not
// lift: too many open streams or connections, a node's grants) is not
// retried, nor is a stream.
//
// The call waits the hint (RetryInfo's when given, else Retry-After's),
// stretched by up to half again at random so that callers refused
// together (a host's agents reconnecting at once) do not all come back
// at the same instant, then is sent again, at most Attempts times in
// all. A hint longer than MaxWait, or one that would end past the
// call's deadline, is not waited for: the refusal is returned at once.
type RetryPolicy struct {
	// Attempts is the most times a call is sent; 1 (or less): no retry.
	Attempts int
	// MaxWait is the longest wait before a retry.
	MaxWait time.Duration
	// Clock reads the time the call's deadline is judged by (nil:
	// WallClock); Wait waits d, or until ctx ends, returning ctx's error
	// then (nil: a timer), and is also how Agent.Run waits before it
	// reconnects; Jitter returns a number in [0, 1) (nil: math/rand).
	// Tests inject them.
	Clock  Clock
	Wait   func(ctx context.Context, d time.Duration) error
	Jitter func() float64
}

// DefaultRetry is a Conn's RetryPolicy unless WithRetry says otherwise:
// up to four attempts, none after a wait of more than ten seconds.
var DefaultRetry = RetryPolicy{Attempts: 4, MaxWait: 10 * time.Second}

// WithRetry sets how the connection retries unary calls refused
// resource_exhausted with a retry hint; RetryPolicy{} (Attempts 0): not
// at all.
func WithRetry(p RetryPolicy) Option {
	return func(o *dialOptions) { o.retry = &p }
}

// RetryHint returns the wait a resource_exhausted refusal asks for before
// the call is sent again (its RetryInfo detail, else its Retry-After
// header), and false when err is no such refusal or carries no hint.
func RetryHint(err error) (time.Duration, bool) {
	var ce *connect.Error
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !errors.As(err, &ce) {
		return 0, false
	}
	for _, d := range ce.Details() {
		msg, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := msg.(*errdetails.RetryInfo); ok && info.GetRetryDelay() != nil {
			if wait := info.GetRetryDelay().AsDuration(); wait >= 0 {
				return wait, true
			}
		}
	}
	if !connect.IsWireError(ce) {
		return 0, false
	}
	v := strings.TrimSpace(ce.Meta().Get("Retry-After"))
	if secs, perr := strconv.Atoi(v); perr == nil && secs >= 0 && secs <= 86400 {
		return time.Duration(secs) * time.Second, true
	}
	return 0, false
}

// MaxReconnectHint is the longest retry hint Agent.Run waits before
// reconnecting a session the control plane refused with one.
const MaxReconnectHint = time.Minute

// stretch is hint stretched by up to half again at random (Jitter).
func (p RetryPolicy) stretch(hint time.Duration) time.Duration {
	jitter := p.Jitter
	if jitter == nil {
		jitter = rand.Float64
	}
	return hint + time.Duration(float64(hint)*jitter()/2)
}

// retrying is the Conn's retry of unary calls (RetryPolicy).
type retrying struct{ p RetryPolicy }

func (r retrying) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		for attempt := 1; ; attempt++ {
			resp, err := next(ctx, req)
			if err == nil || attempt >= r.p.Attempts {
				return resp, err
			}
			wait, ok := r.wait(ctx, err)
			if !ok {
				return resp, err
			}
			if werr := r.sleep(ctx, wait); werr != nil {
				return resp, err // the refusal says more than the context's end
			}
		}
	}
}

// wait is how long to wait before sending again a call refused with err,
// and false when it is not to be sent again.
func (r retrying) wait(ctx context.Context, err error) (time.Duration, bool) {
	hint, ok := RetryHint(err)
	if !ok || hint > r.p.MaxWait {
		return 0, false
	}
	wait := min(r.p.stretch(hint), r.p.MaxWait)
	if deadline, has := ctx.Deadline(); has {
		clk := r.p.Clock
		if clk == nil {
			clk = WallClock
		}
		if clk.Now().Add(hint).After(deadline) {
			return 0, false
		}
		wait = min(wait, deadline.Sub(clk.Now()))
	}
	return wait, true
}

func (r retrying) sleep(ctx context.Context, d time.Duration) error {
	if r.p.Wait != nil {
		return r.p.Wait(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (r retrying) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (r retrying) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
