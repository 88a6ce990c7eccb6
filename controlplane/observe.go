package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// observer is the outermost interceptor: a span, a duration histogram and a
// log line per RPC, so that authentication failures are observed too. It
// never logs request headers or bodies (they carry credentials).
//
// It continues the caller's trace: a W3C traceparent header makes the RPC's
// span a child of the client's span (docs/observability.md says what that
// trusts). Without a tracer provider installed the span is the API's no-op,
// and the header is only looked up.
type observer struct {
	tracer   trace.Tracer
	duration metric.Float64Histogram
	requests metric.Int64Counter
	log      *slog.Logger
	// streams counts streaming RPCs in progress (nil: not counted).
	streams *prometheus.GaugeVec
	// procedures are the procedures whose metric attributes are kept in
	// attrs (an observerKey's metric.MeasurementOption), built once
	// instead of on every call; any other path (a caller may name one that
	// does not exist) has its attributes built each time, so attrs stays
	// bounded.
	procedures map[string]bool
	attrs      sync.Map
}

type observerKey struct{ procedure, code string }

// UnknownProcedure is the rpc.method under which the metrics count a call
// to a path that is not a procedure of this server (refused: unimplemented,
// or unauthenticated before that is known). The path is the caller's
// choice: counted under its own name, each new one would be a new series.
const UnknownProcedure = "unknown"

// attributes are the metric attributes of a call to procedure that ended
// with code.
func (o *observer) attributes(procedure, code string) metric.MeasurementOption {
	if !o.procedures[procedure] {
		return metric.WithAttributes(attribute.String("rpc.method", procedure), attribute.String("rpc.code", code))
	}
	k := observerKey{procedure, code}
	if a, ok := o.attrs.Load(k); ok {
		return a.(metric.MeasurementOption)
	}
	a, _ := o.attrs.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(attribute.String("rpc.method", procedure), attribute.String("rpc.code", code))))
	return a.(metric.MeasurementOption)
}

// traceContext extracts the caller's trace context (W3C tracecontext
// only: the server neither trusts nor forwards a caller's baggage).
var traceContext = propagation.TraceContext{}

// startSpan starts the server span of an RPC, continuing the caller's trace.
func (o *observer) startSpan(ctx context.Context, procedure string, header http.Header) (context.Context, trace.Span) {
	// The header's canonical key, looked up as Get would after
	// canonicalising "traceparent" (a new string on every call).
	if v := header["Traceparent"]; len(v) > 0 && v[0] != "" {
		ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(header))
	}
	ctx, span := o.tracer.Start(ctx, strings.TrimPrefix(procedure, "/"), trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		service, method, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
		span.SetAttributes(attribute.String("rpc.system", "connect_rpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", method))
	}
	return ctx, span
}

func newObserver(meter metric.Meter, log *slog.Logger, procedures map[string]bool) (*observer, error) {
	duration, err := meter.Float64Histogram("rpc.server.duration",
		metric.WithUnit("s"), metric.WithDescription("Duration of control-plane RPCs."))
	if err != nil {
		return nil, err
	}
	requests, err := meter.Int64Counter("rpc.server.requests",
		metric.WithDescription("Control-plane RPCs by procedure and code."))
	if err != nil {
		return nil, err
	}
	return &observer{tracer: otel.Tracer("github.com/tetherhq/tether/controlplane"), duration: duration, requests: requests, log: log, procedures: procedures}, nil
}

func (o *observer) record(ctx context.Context, procedure string, start time.Time, err error) {
	o.recordFrom(ctx, procedure, start, err, false)
}

// recordFrom is record for an RPC whose error may be its caller's doing:
// fromPeer, a stream whose message the caller broke (receiveWatch), is
// logged at debug level as a refusal is, whatever its code — Connect fails
// a message cut short as internal ("protocol error"), and one line at
// error level for each such request, free without a credential on server
// reflection's stream, was the caller's to write (rogue45g test
// TestRogue45GCATruncatedMessageIsNotLoggedAsTheServersError).
func (o *observer) recordFrom(ctx context.Context, procedure string, start time.Time, err error, fromPeer bool) {
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	attrs := o.attributes(procedure, code)
	elapsed := time.Since(start)
	o.duration.Record(ctx, elapsed.Seconds(), attrs)
	o.requests.Add(ctx, 1, attrs)
	switch {
	case err == nil:
		// Checked first: the arguments would be boxed (allocated) for a
		// line that is usually not written.
		if o.log.Enabled(ctx, slog.LevelDebug) {
			o.log.Debug("rpc", "procedure", procedure, "duration", elapsed)
		}
	case fromPeer:
		o.log.Debug("rpc refused: the caller's message could not be read", "procedure", procedure, "code", code, "error", err)
	case connect.CodeOf(err) == connect.CodeInternal || connect.CodeOf(err) == connect.CodeUnknown:
		o.log.Error("rpc failed", "procedure", procedure, "code", code, "error", err)
	default:
		o.log.Debug("rpc refused", "procedure", procedure, "code", code, "error", err)
	}
}

func (o *observer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		start := time.Now()
		ctx, span := o.startSpan(ctx, req.Spec().Procedure, req.Header())
		defer span.End()
		resp, err := next(ctx, req)
		err = toConnect(err) // a handler's unconverted error gets its category's code, not "unknown"
		if err != nil {
			span.SetStatus(codes.Error, connect.CodeOf(err).String())
		}
		o.record(ctx, req.Spec().Procedure, start, err)
		return resp, err
	}
}

func (o *observer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (o *observer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		ctx, span := o.startSpan(ctx, conn.Spec().Procedure, conn.RequestHeader())
		defer span.End()
		if o.streams != nil {
			open := o.streams.WithLabelValues(conn.Spec().Procedure)
			open.Inc()
			defer open.Dec()
		}
		rw := &receiveWatch{StreamingHandlerConn: conn}
		err := toConnect(next(ctx, rw))
		if err != nil && !errors.Is(err, context.Canceled) {
			span.SetStatus(codes.Error, connect.CodeOf(err).String())
		}
		o.recordFrom(ctx, conn.Spec().Procedure, start, err, rw.brokeIt(err))
		return err
	}
}

// receiveWatch remembers the error with which reading the caller's next
// message failed (its end, io.EOF, aside): a stream that ends with it
// ended for what its caller sent (a message cut short, one past the
// limit, one that does not decode), not for a fault of the server's.
// A relay may still be receiving as its handler returns (a forwarded
// Channel's reader), so it is read under mu.
type receiveWatch struct {
	connect.StreamingHandlerConn
	mu     sync.Mutex
	failed error
}

func (r *receiveWatch) Receive(m any) error {
	err := r.StreamingHandlerConn.Receive(m)
	if err != nil && !errors.Is(err, io.EOF) {
		r.mu.Lock()
		r.failed = err
		r.mu.Unlock()
	}
	return err
}

// brokeIt reports whether err is the error a Receive failed with.
func (r *receiveWatch) brokeIt(err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed != nil && errors.Is(err, r.failed)
}

// recoverPanic turns a handler panic into an Internal error without the
// panic value (which could hold request data).
func recoverPanic(log *slog.Logger) connect.HandlerOption {
	return connect.WithRecover(func(_ context.Context, spec connect.Spec, _ http.Header, p any) error {
		log.Error("handler panic", "procedure", spec.Procedure, "panic", fmt.Sprint(p))
		return connect.NewError(connect.CodeInternal, errors.New("internal error"))
	})
}
