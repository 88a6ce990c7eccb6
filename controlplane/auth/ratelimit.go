package auth

import (
	"sync"
	"time"
)

// RateLimiter is a token bucket per budget: each budget may spend Rate
// requests per second on average, in bursts of up to Burst. Time comes
// from Now, so tests drive it with a manual clock. The zero Rate disables
// it.
//
// It bounds what one caller — a runaway agent, a stuck retry loop, a
// swarm spawning children to multiply its share — can take from the
// control plane; it is not a fairness scheduler. The Interceptor decides
// the budget a request spends from (Budget): an agent spends from its
// lineage's (a root agent and every descendant share one), an operator
// from its own, and a request without a valid credential from its source
// address's. Every message of a stream costs one request, like a unary
// call.
type RateLimiter struct {
	Rate  float64
	Burst float64
	Now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// Allow takes one token from budget and reports whether it had one, and if
// not, how long until it will.
func (l *RateLimiter) Allow(budget string) (bool, time.Duration) {
	return l.take(budget, 1, true)
}

// AllowN takes n tokens at once (a batch of n messages); it refuses, taking
// nothing, when fewer than n are left. n beyond the burst can never pass.
func (l *RateLimiter) AllowN(budget string, n int) (bool, time.Duration) {
	return l.take(budget, float64(n), true)
}

// Exhausted reports whether budget has no token left, without taking one,
// and if so how long until it will. It lets a caller refuse before doing
// expensive work it would charge for afterwards.
func (l *RateLimiter) Exhausted(budget string) (bool, time.Duration) {
	ok, wait := l.take(budget, 1, false)
	return !ok, wait
}

// Owe takes n tokens from budget for work already done (a subtree read
// whole before its size, and so its price, was known; an answer built
// before its size was): all n even when fewer are left, the budget going
// into debt that refills at its rate as a spent budget does, so that it
// admits nothing until the debt is refilled. AllowN takes nothing when it
// refuses, which suits a price asked before the work; asked after it, a
// refusal waived the price of what was done.
func (l *RateLimiter) Owe(budget string, n int) {
	if l == nil || l.Rate <= 0 || n <= 0 {
		return
	}
	now := l.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill(budget, now).tokens -= float64(n)
}

// give returns n tokens to budget (a request it was charged for that
// turned out to be paid otherwise), up to the burst.
func (l *RateLimiter) give(budget string, n float64) {
	if l == nil || l.Rate <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.buckets[budget]; ok {
		b.tokens = min(l.Burst, b.tokens+n)
	}
}

func (l *RateLimiter) take(budget string, n float64, spend bool) (bool, time.Duration) {
	if l == nil || l.Rate <= 0 {
		return true, 0
	}
	now := l.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.buckets[budget]; !ok && !spend {
		return true, 0 // a full bucket
	}
	b := l.refill(budget, now)
	if b.tokens >= n {
		if spend {
			b.tokens -= n
		}
		return true, 0
	}
	wait := time.Duration((n - b.tokens) / l.Rate * float64(time.Second))
	return false, wait
}

// refill returns budget's bucket (a full one if it had none) topped up to
// now. l.mu is held.
func (l *RateLimiter) refill(budget string, now time.Time) *bucket {
	if l.buckets == nil {
		l.buckets = map[string]*bucket{}
	}
	b, ok := l.buckets[budget]
	if !ok {
		b = &bucket{tokens: l.Burst, last: now}
		l.buckets[budget] = b
	}
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(l.Burst, b.tokens+elapsed*l.Rate)
		b.last = now
	}
	l.sweep(now)
	return b
}

// sweep forgets budgets whose bucket has been full for a minute, so the map
// does not grow with every agent or address that ever called.
func (l *RateLimiter) sweep(now time.Time) {
	if now.Sub(l.swept) < time.Minute {
		return
	}
	l.swept = now
	for k, b := range l.buckets {
		if now.Sub(b.last).Seconds()*l.Rate+b.tokens >= l.Burst && now.Sub(b.last) > time.Minute {
			delete(l.buckets, k)
		}
	}
}
