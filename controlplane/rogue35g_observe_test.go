package controlplane

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The server span of an RPC continues the caller's trace when its request
// carries a W3C traceparent header (docs/observability.md), whatever the
// case the caller wrote the header's name in (the servers keep every
// request header under its canonical key, "Traceparent", which the
// observer looks up without canonicalising a key on each call: thirty-fifth
// pass perf), and starts a trace of its own when it carries none.
func TestRogue35GServerSpanContinuesTheCallersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	obs, err := newObserver(noop.NewMeterProvider().Meter("test"), slog.New(slog.DiscardHandler), map[string]bool{})
	if err != nil {
		t.Fatal(err)
	}
	obs.tracer = tp.Tracer("test")
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, name := range []string{"traceparent", "Traceparent", "TRACEPARENT"} {
		h := http.Header{}
		h.Add(name, "00-"+traceID+"-"+parentID+"-01") // Add canonicalises, as the servers do
		_, span := obs.startSpan(context.Background(), "/tether.v1.AgentService/GetNode", h)
		span.End()
		got := rec.Ended()[len(rec.Ended())-1]
		if got.SpanContext().TraceID().String() != traceID || got.Parent().SpanID().String() != parentID || !got.Parent().IsRemote() {
			t.Fatalf("header %q: the server span is in trace %s under %s (remote %v), not the caller's %s under %s",
				name, got.SpanContext().TraceID(), got.Parent().SpanID(), got.Parent().IsRemote(), traceID, parentID)
		}
	}
	_, span := obs.startSpan(context.Background(), "/tether.v1.AgentService/GetNode", http.Header{})
	span.End()
	if got := rec.Ended()[len(rec.Ended())-1]; got.Parent().IsValid() || got.SpanContext().TraceID().String() == traceID {
		t.Fatalf("without a traceparent the server span has parent %v in trace %s", got.Parent(), got.SpanContext().TraceID())
	}
}
