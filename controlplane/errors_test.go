package controlplane

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
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
