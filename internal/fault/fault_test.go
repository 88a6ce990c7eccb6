package fault_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/fault"
)

var (
	errNodeNotFound = fault.New(fault.NotFound, "tree: node not found")
	errRejected     = fault.New(fault.Denied, "ledger: token rejected")
	errExpired      = fault.New(fault.Unauthenticated, "token: expired")
	errCorrupt      = fault.New(fault.Internal, "codec: corrupt record")
)

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want fault.Kind
	}{
		{"nil", nil, fault.Internal},
		{"plain error", errors.New("boom"), fault.Internal},
		{"sentinel", errNodeNotFound, fault.NotFound},
		{"wrapped with context", fmt.Errorf("get: %w", fmt.Errorf("%w: n1", errNodeNotFound)), fault.NotFound},
		{"outer sentinel wins over its cause", fmt.Errorf("%w: %w", errRejected, errExpired), fault.Denied},
		{"internal does not hide a category beneath", fmt.Errorf("%w: %w", errCorrupt, errNodeNotFound), fault.NotFound},
		{"joined", errors.Join(errors.New("x"), errExpired), fault.Unauthenticated},
		{"errorf", fault.Errorf(fault.Exhausted, "%d open streams, the limit", 8), fault.Exhausted},
		{"errorf wrapping", fault.Errorf(fault.Precondition, "agent %s: %w", "n1", errCorrupt), fault.Precondition},
	} {
		if got := fault.KindOf(tc.err); got != tc.want {
			t.Errorf("%s: KindOf = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestSentinelsKeepIdentityAndMessage(t *testing.T) {
	err := fmt.Errorf("%w: n1", errNodeNotFound)
	if !errors.Is(err, errNodeNotFound) || errors.Is(err, errRejected) {
		t.Fatalf("errors.Is does not tell the sentinels apart: %v", err)
	}
	if err.Error() != "tree: node not found: n1" {
		t.Fatalf("message %q", err)
	}
	// Two sentinels with the same kind and message are still distinct.
	if errors.Is(fault.New(fault.NotFound, "tree: node not found"), errNodeNotFound) {
		t.Fatal("a new sentinel matched an old one")
	}
	wrapped := fault.Errorf(fault.Invalid, "field x: %w", errCorrupt)
	if !errors.Is(wrapped, errCorrupt) || wrapped.Error() != "field x: codec: corrupt record" {
		t.Fatalf("Errorf lost its cause: %v", wrapped)
	}
}

func ExampleKindOf() {
	errRuleNotFound := fault.New(fault.NotFound, "stoprule: rule not found")
	err := fmt.Errorf("%w: %q on node n1", errRuleNotFound, "budget")
	fmt.Println(err)
	fmt.Println(fault.KindOf(err), errors.Is(err, errRuleNotFound))
	// Output:
	// stoprule: rule not found: "budget" on node n1
	// not found true
}
