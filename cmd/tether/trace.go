package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tetherhq/tether/internal/tracing"
)

// flushTimeout bounds how long the process waits at exit for its spans to
// reach the collector.
const flushTimeout = 5 * time.Second

// startTracing installs tracing from the OTEL_* environment
// (internal/tracing) and, for a client command, starts the span of the
// whole command, under which every RPC it makes is a child. `serve` gets no
// such span (it would last for the server's life): its spans are the RPCs
// it serves. end finishes the span and flushes what is buffered; a
// collector that cannot be reached delays the exit by at most flushTimeout
// and never fails the command.
func startTracing(ctx context.Context, root *cobra.Command, args []string) (context.Context, func(error)) {
	service := "tether-cli"
	cmd, _, findErr := root.Find(args)
	long := findErr == nil && cmd != nil && longRunning(cmd)
	if long {
		service = "tether"
	}
	shutdown, err := tracing.Setup(ctx, service)
	if err != nil {
		fmt.Fprintf(os.Stderr, "warning: tracing disabled: %v\n", err)
	}
	var span trace.Span
	if !long && findErr == nil && cmd != nil && cmd != root {
		ctx, span = otel.Tracer("github.com/tetherhq/tether/cmd/tether").Start(ctx, cmd.CommandPath(), trace.WithSpanKind(trace.SpanKindClient))
	}
	return ctx, func(err error) {
		if span != nil {
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
		flush, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := shutdown(flush); err != nil {
			fmt.Fprintf(os.Stderr, "warning: could not send traces: %v\n", err)
		}
	}
}

// longRunning: commands that serve rather than call.
func longRunning(cmd *cobra.Command) bool {
	path := cmd.CommandPath()
	return path == "tether serve" || strings.HasPrefix(path, "tether mcp") || path == "tether demo"
}
