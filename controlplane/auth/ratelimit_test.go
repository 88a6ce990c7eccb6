package auth

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
)

func TestRateLimiterBoundsEachCallerSeparately(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	l := &RateLimiter{Rate: 10, Burst: 3, Now: clk.Now}
	for i := 0; i < 3; i++ {
		if ok, _ := l.Allow("agent:a"); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	ok, wait := l.Allow("agent:a")
	if ok {
		t.Fatal("fourth request in the same instant allowed")
	}
	if wait != 100*time.Millisecond {
		t.Fatalf("wait = %s, want 100ms at 10/s", wait)
	}
	if ok, _ := l.Allow("agent:b"); !ok {
		t.Fatal("another caller was limited by agent:a's bucket")
	}
	clk.Advance(100 * time.Millisecond)
	if ok, _ := l.Allow("agent:a"); !ok {
		t.Fatal("a token did not refill after 100ms")
	}
	if ok, _ := l.Allow("agent:a"); ok {
		t.Fatal("more than one token refilled after 100ms")
	}
	clk.Advance(time.Hour)
	if ok, _ := l.Allow("agent:c"); !ok || len(l.buckets) != 1 {
		t.Fatalf("idle buckets were not swept: %d left", len(l.buckets))
	}
}

func TestZeroRateDisablesTheLimiter(t *testing.T) {
	l := &RateLimiter{}
	for i := 0; i < 1000; i++ {
		if ok, _ := l.Allow("x"); !ok {
			t.Fatal("a disabled limiter refused")
		}
	}
}

func TestAllowNAndExhausted(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	l := &RateLimiter{Rate: 10, Burst: 5, Now: clk.Now}
	if limited, _ := l.Exhausted("lineage:n_a"); limited {
		t.Fatal("an unseen budget is exhausted")
	}
	if ok, _ := l.AllowN("lineage:n_a", 4); !ok {
		t.Fatal("a batch of 4 within a burst of 5 refused")
	}
	ok, wait := l.AllowN("lineage:n_a", 3)
	if ok || wait != 200*time.Millisecond {
		t.Fatalf("a batch of 3 with 1 token left: %v, wait %s; want refused, 200ms", ok, wait)
	}
	// A refused batch takes nothing; peeking takes nothing either.
	if limited, _ := l.Exhausted("lineage:n_a"); limited {
		t.Fatal("the refused batch took tokens")
	}
	if ok, _ := l.Allow("lineage:n_a"); !ok {
		t.Fatal("the last token was not left")
	}
	if limited, wait := l.Exhausted("lineage:n_a"); !limited || wait != 100*time.Millisecond {
		t.Fatalf("Exhausted after the last token: %v %s", limited, wait)
	}
	if ok, _ := l.AllowN("lineage:n_a", 6); ok {
		t.Fatal("a batch larger than the burst passed")
	}
	var none *RateLimiter
	if ok, _ := none.AllowN("x", 100); !ok {
		t.Fatal("a nil limiter refused")
	}
}

// TestOweTakesThePriceOfWorkDonePastTheBudget: AllowN takes nothing when
// it refuses; Owe takes the whole price all the same (the work is done),
// and the budget refills from its debt before it admits anything again.
func TestOweTakesThePriceOfWorkDonePastTheBudget(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	l := &RateLimiter{Rate: 10, Burst: 3, Now: clk.Now}
	l.Owe("agent:a", 2) // 1 left
	l.Owe("agent:a", 3) // -2
	ok, wait := l.Allow("agent:a")
	if ok {
		t.Fatal("a request was admitted from a budget in debt")
	}
	if wait != 300*time.Millisecond { // from -2 to 1 at 10/s
		t.Fatalf("wait = %s, want 300ms (the debt of 2, then one request)", wait)
	}
	clk.Advance(200 * time.Millisecond)
	if ok, _ := l.Allow("agent:a"); ok {
		t.Fatal("a request was admitted while the budget was still refilling its debt")
	}
	clk.Advance(100 * time.Millisecond)
	if ok, _ := l.Allow("agent:a"); !ok {
		t.Fatal("a request was refused once the debt was refilled")
	}
	l.Owe("agent:b", 0)
	if ok, _ := l.AllowN("agent:b", 3); !ok {
		t.Fatal("a price of nothing took something")
	}
	var none *RateLimiter
	none.Owe("x", 100)
}
