package store

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// CommitStats describe one durable commit: a Badger group commit, or one
// etcd transaction.
type CommitStats struct {
	// Updates is how many Update calls it answered.
	Updates int
	// Duration runs from taking the Updates (running their functions
	// included) to their writes being durable.
	Duration time.Duration
}

// CommitObserver is told about every commit, on the committing goroutine:
// it must return quickly (count, observe a histogram) and never call the
// store.
type CommitObserver func(CommitStats)

// CommitObservers holds the observer a backend was given (none by
// default); backends call Observe after each commit.
type CommitObservers struct {
	fn atomic.Pointer[CommitObserver]
}

// Set makes fn see every commit from now on (nil stops).
func (o *CommitObservers) Set(fn CommitObserver) {
	if fn == nil {
		o.fn.Store(nil)
		return
	}
	o.fn.Store(&fn)
}

// Observe reports one commit of updates Updates that took took.
func (o *CommitObservers) Observe(updates int, took time.Duration) {
	if fn := o.fn.Load(); fn != nil && updates > 0 {
		(*fn)(CommitStats{Updates: updates, Duration: took})
	}
}

// tracer names the store's spans. It is the global provider's: without
// one installed, spans are the API's no-ops.
func tracer() trace.Tracer { return otel.Tracer("github.com/tetherhq/tether/internal/store") }

// commitSpanName is the span of a group commit (Badger) or of one Update's
// transaction (etcd).
const commitSpanName = "store.commit"

// RecordBatchSpan records the span of a group commit that had traced
// callers, once it is over: started when the batch was taken, a child of the
// first traced caller's span (so that its trace shows the commit it waited
// for) and linked to every traced caller's span. A batch with no traced
// caller records nothing and costs one context lookup per request.
func RecordBatchSpan(start time.Time, traced []trace.Link, requests, updates int, revision uint64, err error) {
	parent := trace.ContextWithSpanContext(context.Background(), traced[0].SpanContext)
	_, span := tracer().Start(parent, commitSpanName,
		trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(traced...),
		trace.WithAttributes(attribute.Int("tether.store.batch.requests", requests)))
	EndSpan(span, err, attribute.Int("tether.store.batch.updates", updates), attribute.Int64("tether.store.revision", int64(revision)))
}

// EndSpan ends span (if any), marking it failed with err.
func EndSpan(span trace.Span, err error, attrs ...attribute.KeyValue) {
	if span == nil {
		return
	}
	span.SetAttributes(attrs...)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// StartUpdateSpan starts the span of one etcd Update when its caller is
// traced (nil otherwise).
func StartUpdateSpan(ctx context.Context) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return ctx, nil
	}
	return tracer().Start(ctx, commitSpanName, trace.WithSpanKind(trace.SpanKindInternal))
}
