// Package tracing installs an OpenTelemetry tracer provider configured by
// the standard OTEL_* environment, for `tether serve` and the CLI alike.
//
// Nothing is exported unless an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT):
// without one, Setup installs only the W3C propagator, every span is the
// API's no-op and costs next to nothing. The protocol is chosen by
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL:
// "http/protobuf" (the default) or "grpc". The exporters read the rest of
// their settings (headers, timeout, TLS, compression) from the environment
// themselves; the SDK reads the sampler (OTEL_TRACES_SAMPLER) and the batch
// processor (OTEL_BSP_*), and the resource takes OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn exporting off.
//
// The caller's duty: call the returned shutdown before the process exits,
// so that the spans still buffered are sent.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Propagator is what Tether injects into and extracts from requests: the
// W3C trace context and baggage.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Shutdown flushes the spans still buffered and stops exporting.
type Shutdown func(context.Context) error

// Enabled reports whether the environment asks for spans to be exported.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exporter := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exporter {
	case "", "otlp":
	default:
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Protocol is the OTLP protocol the environment asks for.
func Protocol() string {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			return v
		}
	}
	return "http/protobuf"
}

// Setup installs the global propagator and, when Enabled, a tracer provider
// exporting over OTLP, as the global one. service is the default
// service.name (OTEL_SERVICE_NAME overrides it). The error never holds the
// exporter's headers (they may carry an API key).
func Setup(ctx context.Context, service string) (Shutdown, error) {
	otel.SetTextMapPropagator(Propagator())
	if exporter := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exporter != "" && exporter != "otlp" && exporter != "none" {
		return noShutdown, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q is not supported (otlp or none)", exporter)
	}
	if !Enabled() {
		return noShutdown, nil
	}
	var (
		exporter sdktrace.SpanExporter
		err      error
	)
	switch protocol := Protocol(); protocol {
	case "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return noShutdown, fmt.Errorf("tracing: OTLP protocol %q is not supported (http/protobuf or grpc)", protocol)
	}
	if err != nil {
		return noShutdown, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return noShutdown, fmt.Errorf("tracing: resource: %w", err)
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(provider)
	return provider.Shutdown, nil
}

func noShutdown(context.Context) error { return nil }
