package auth

import (
	"sync"
	"time"
)

// RateLimiter is a token bucket per principal: each caller may make Rate
// requests per second on average, in bursts of up to Burst. Time comes from
// Now, so tests drive it with a manual clock. The zero Rate disables it.
//
// It bounds what one caller — a runaway agent, a stuck retry loop — can
// take from the control plane; it is not a fairness scheduler. Streams
// count once when opened; the messages on a lease Channel are the
// high-rate path and are not counted here.
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

// Allow takes one token for principal and reports whether it had one, and
// if not, how long until it will.
func (l *RateLimiter) Allow(principal string) (bool, time.Duration) {
	if l == nil || l.Rate <= 0 {
		return true, 0
	}
	now := l.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*bucket{}
	}
	b, ok := l.buckets[principal]
	if !ok {
		b = &bucket{tokens: l.Burst, last: now}
		l.buckets[principal] = b
	}
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(l.Burst, b.tokens+elapsed*l.Rate)
		b.last = now
	}
	l.sweep(now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.Rate * float64(time.Second))
	return false, wait
}

// sweep forgets callers whose bucket has been full for a minute, so the map
// does not grow with every agent that ever called.
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
