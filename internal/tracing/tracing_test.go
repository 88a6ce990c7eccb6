package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestNothingIsExportedWithoutAnEndpoint: without an OTLP endpoint, or with
// exporting turned off, Setup installs no provider, so spans stay the API's
// no-ops.
func TestNothingIsExportedWithoutAnEndpoint(t *testing.T) {
	for _, env := range [][2]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", ""},
		{"OTEL_SDK_DISABLED", "true"},
		{"OTEL_TRACES_EXPORTER", "none"},
	} {
		t.Run(env[0]+"="+env[1], func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
			t.Setenv(env[0], env[1])
			shutdown, err := Setup(context.Background(), "test")
			if err != nil {
				t.Fatal(err)
			}
			defer shutdown(context.Background())
			if _, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider); isSDK {
				t.Fatalf("a tracer provider was installed with %s=%q", env[0], env[1])
			}
		})
	}
}

// TestUnsupportedSettingsAreRefusedByName: a protocol or exporter Tether
// does not speak is an error naming it.
func TestUnsupportedSettingsAreRefusedByName(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", `"http/json" is not supported`},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon", `"carrier-pigeon" is not supported`},
		{"OTEL_TRACES_EXPORTER", "zipkin", `OTEL_TRACES_EXPORTER="zipkin" is not supported`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
			t.Setenv(c.name, c.value)
			_, err := Setup(context.Background(), "test")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Setup with %s=%s: %v, want %q", c.name, c.value, err, c.want)
			}
		})
	}
}

// TestTheTracesProtocolOverridesTheGeneralOne follows the specification's
// precedence.
func TestTheTracesProtocolOverridesTheGeneralOne(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	if got := Protocol(); got != "grpc" {
		t.Fatalf("Protocol() = %q, want grpc", got)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	if got := Protocol(); got != "http/protobuf" {
		t.Fatalf("Protocol() = %q, want http/protobuf", got)
	}
}
