package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// Every category has a code: a category added without one would answer
// a client with a code nobody chose.
func TestEveryCategoryHasACode(t *testing.T) {
	if len(codeOf) != int(fault.Unavailable)+1 {
		t.Fatalf("codeOf has %d entries for %d categories", len(codeOf), int(fault.Unavailable)+1)
	}
	for k, code := range codeOf {
		if code == 0 {
			t.Errorf("category %s has no code", fault.Kind(k))
		}
	}
}

func TestToConnect(t *testing.T) {
	preset := connect.NewError(connect.CodeResourceExhausted, errors.New("rate limit"))
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("%w: %q on n_1", stoprule.ErrRuleNotFound, "budget"), connect.CodeNotFound},
		{fmt.Errorf("get: %w", store.ErrNotFound), connect.CodeNotFound},
		{stoprule.ErrDuplicate, connect.CodeAlreadyExists},
		{coordinator.ErrPrecondition, connect.CodeAborted},
		{fmt.Errorf("%w: %w", coordinator.ErrCommit, store.ErrTooLarge), connect.CodeUnavailable},
		// The outer sentinel decides: a request that names a malformed scope
		// is invalid, whatever the scope's own fault.
		{fmt.Errorf("%w: required scope: %w", grantstore.ErrInvalidArgument, capability.ErrScopeEscalation), connect.CodeInvalidArgument},
		{capability.ErrTokenExpired, connect.CodeUnauthenticated},
		{fmt.Errorf("%w: %w", coordinator.ErrCorrupt, context.Canceled), connect.CodeCanceled},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{errors.New("boom"), connect.CodeInternal},
		{fault.New(fault.Kind(200), "a category with no code"), connect.CodeInternal},
		{fmt.Errorf("handler: %w", preset), connect.CodeResourceExhausted},
	} {
		if got := connect.CodeOf(toConnect(tc.err)); got != tc.want {
			t.Errorf("toConnect(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if toConnect(nil) != nil {
		t.Error("toConnect(nil) is not nil")
	}
	if got := toConnect(stoprule.ErrRuleNotFound).(*connect.Error).Message(); got != "stoprule: rule not found" {
		t.Errorf("message %q: the sentinel's text must reach the client unchanged", got)
	}
}

// streamConn is the least of a handler's stream the observer reads.
type streamConn struct{ connect.StreamingHandlerConn }

func (streamConn) Spec() connect.Spec {
	return connect.Spec{Procedure: "/tether.v1.AgentService/Session"}
}
func (streamConn) RequestHeader() http.Header { return http.Header{} }

// A handler that returns a domain error it forgot to convert still
// answers the error's code, not "unknown": a terminated agent's heartbeat
// refused inside the session handler ends its stream Unauthenticated even
// when the interceptor's watch of the node has not yet ended it.
func TestAnErrorLeavingAHandlerUnconvertedGetsItsCode(t *testing.T) {
	obs, err := newObserver(noop.NewMeterProvider().Meter("test"), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	revoked := fmt.Errorf("%w: node n_1 is terminated", auth.ErrRevoked)
	err = obs.WrapStreamingHandler(func(context.Context, connect.StreamingHandlerConn) error { return revoked })(context.Background(), streamConn{})
	if connect.CodeOf(err) != connect.CodeUnauthenticated || !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("stream ended with %v (%s), want unauthenticated wrapping the revocation", err, connect.CodeOf(err))
	}
	_, err = obs.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, revoked })(context.Background(), connect.NewRequest(&struct{}{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("call ended with %v (%s), want unauthenticated", err, connect.CodeOf(err))
	}
	// A Connect error keeps the code its handler chose.
	chosen := connect.NewError(connect.CodeFailedPrecondition, revoked)
	err = obs.WrapStreamingHandler(func(context.Context, connect.StreamingHandlerConn) error { return chosen })(context.Background(), streamConn{})
	if err != chosen {
		t.Fatalf("stream ended with %v, want the handler's own error", err)
	}
}
