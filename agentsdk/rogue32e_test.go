package agentsdk_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// forgedSignature is token with one character of its signature changed:
// well formed, and refused once verified.
func forgedSignature(token string, n int) string {
	i := len(token) - 2 - n%40
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	return token[:i] + string(c) + token[i+1:]
}

// TestRogue32EAJoinRefusedByTheAddressesBudgetIsRetriedAfterTheHint: a
// rogue on the honest agents' address (a NAT, a shared host) spends the
// address's budget for requests without a valid credential with forged
// tokens; an honest child joining with its fresh credential (which must
// be verified, paid from that budget) was refused resource_exhausted, and
// the SDK handed the refusal to the agent, which failed to start, though
// the refusal said when to come back. The SDK now retries a unary call
// refused resource_exhausted with a retry hint, after the hint, a bounded
// number of times.
func TestRogue32EAJoinRefusedByTheAddressesBudgetIsRetriedAfterTheHint(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1 // bursts of 2
	})
	ctx := context.Background()
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	parent, err := agentsdk.RegisterRoot(ctx, admin, "parent", nil)
	if err != nil {
		t.Fatal(err)
	}
	// fresh is a child's credential not yet verified (each subtest's own).
	// The one Spawn answers is remembered as verified as it is minted
	// (since the thirty-third pass, rogue33b): the child gets another,
	// minted by the key ring alone, as another replica or the control
	// plane before a restart would have minted it.
	fresh := func(t *testing.T) agentsdk.Child {
		t.Helper()
		child, err := parent.Spawn(ctx, "child", nil)
		if err != nil {
			t.Fatal(err)
		}
		if child.Credential, _, err = srv.Issuer().MintAgent(child.Node.NodeId, clk.Now(), time.Hour); err != nil {
			t.Fatal(err)
		}
		return child
	}

	// spend has the rogue, on its own connection, spend the address's budget.
	rogue := testserver.H2CClient()
	spend := func(t *testing.T, child agentsdk.Child) {
		t.Helper()
		for k := range 16 {
			c := agentsdk.Dial(srv.URL, forgedSignature(child.Credential, k), agentsdk.WithHTTPClient(rogue), agentsdk.WithRetry(agentsdk.RetryPolicy{}))
			_, err := c.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
			if connect.CodeOf(err) == connect.CodeResourceExhausted {
				return
			}
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Fatalf("forged token %d: %v", k, err)
			}
		}
		t.Fatal("16 forged tokens never spent the address's budget")
	}

	t.Run("without retries the join fails", func(t *testing.T) {
		child := fresh(t)
		spend(t, child)
		_, err := agentsdk.Join(ctx, srv.URL, child.Credential, testserver.H2CClient(), agentsdk.WithRetry(agentsdk.RetryPolicy{}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("a join with the address's budget spent and no retries: %v, want resource_exhausted", err)
		}
		if hint, ok := agentsdk.RetryHint(err); !ok || hint <= 0 || hint > time.Second {
			t.Errorf("the refusal's hint: %v %v, want up to a second (the budget refills one a second)", hint, ok)
		}
	})

	t.Run("by default it is retried after the hint", func(t *testing.T) {
		clk.Advance(time.Minute)
		child := fresh(t)
		spend(t, child)
		var mu sync.Mutex
		var waits []time.Duration
		policy := agentsdk.DefaultRetry
		policy.Clock = clk
		policy.Jitter = func() float64 { return 0 }
		policy.Wait = func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			clk.Advance(d) // the wait, on the server's clock
			return nil
		}
		a, err := agentsdk.Join(ctx, srv.URL, child.Credential, testserver.H2CClient(), agentsdk.WithRetry(policy))
		if err != nil {
			t.Fatalf("a join with the address's budget spent, retried: %v", err)
		}
		if a.NodeID() != child.Node.NodeId {
			t.Errorf("joined as %s, want %s", a.NodeID(), child.Node.NodeId)
		}
		if len(waits) != 1 || waits[0] <= 0 || waits[0] > time.Second {
			t.Errorf("waits before the retries: %v, want one of the hint (up to a second)", waits)
		}
	})

	t.Run("a budget kept spent is retried a bounded number of times", func(t *testing.T) {
		clk.Advance(time.Minute)
		child := fresh(t)
		spend(t, child)
		waits := 0
		policy := agentsdk.DefaultRetry
		policy.Clock = clk
		policy.Wait = func(ctx context.Context, d time.Duration) error {
			waits++ // the server's clock does not move: the rogue keeps the budget spent
			return nil
		}
		_, err := agentsdk.Join(ctx, srv.URL, child.Credential, testserver.H2CClient(), agentsdk.WithRetry(policy))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("a join while the budget stays spent: %v, want resource_exhausted", err)
		}
		if waits != policy.Attempts-1 {
			t.Errorf("%d waits, want %d (Attempts %d)", waits, policy.Attempts-1, policy.Attempts)
		}
	})
}

// TestRogue32ERetryHintsAndTheirBounds: what a refusal's hint asks for,
// and what is never waited for.
func TestRogue32ERetryHintsAndTheirBounds(t *testing.T) {
	hinted := func(d time.Duration) error {
		err := connect.NewError(connect.CodeResourceExhausted, errors.New("rate limit"))
		detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if derr != nil {
			t.Fatal(derr)
		}
		err.AddDetail(detail)
		return err
	}
	if d, ok := agentsdk.RetryHint(hinted(1500 * time.Millisecond)); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryInfo 1.5s: %v %v", d, ok)
	}
	if _, ok := agentsdk.RetryHint(connect.NewError(connect.CodeResourceExhausted, errors.New("too many streams"))); ok {
		t.Error("a resource_exhausted refusal without a hint has one")
	}
	if _, ok := agentsdk.RetryHint(connect.NewError(connect.CodeUnavailable, errors.New("x"))); ok {
		t.Error("an unavailable error has a hint")
	}
}
