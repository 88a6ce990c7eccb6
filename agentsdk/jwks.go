package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/capability"
)

// JWKSPath is where the control plane publishes its public keys.
const JWKSPath = "/.well-known/jwks.json"

// maxJWKSBytes bounds the key set a verifier will read.
const maxJWKSBytes = 1 << 20

// jwksCache holds the control plane's public keys for offline
// verification. It refetches on an unknown kid, at most once per
// minInterval on the verifier's clock, so a flood of tokens with made-up
// kids cannot turn into a flood of fetches. Scheduled fetches (at start and
// every jwksRefreshEvery) do not count against that limit: a key that
// starts signing just after one is still picked up at once.
type jwksCache struct {
	url         string
	http        *http.Client
	now         func() time.Time
	minInterval time.Duration
	timeout     time.Duration // of one fetch (VerifierConfig.JWKSFetchTimeout)

	ring atomic.Pointer[capability.KeyRing]

	mu           sync.Mutex // serializes fetches
	lastOnDemand time.Time
}

func newJWKSCache(baseURL string, hc *http.Client, now func() time.Time, minInterval, timeout time.Duration) *jwksCache {
	c := &jwksCache{url: baseURL + JWKSPath, http: hc, now: now, minInterval: minInterval, timeout: timeout}
	c.ring.Store(&capability.KeyRing{})
	return c
}

// keys returns the cached ring, a capability.KeyLookup, and its identity:
// a caller that saw an unknown kid passes it to refreshAfterMiss.
func (c *jwksCache) keys() *capability.KeyRing { return c.ring.Load() }

// refreshAfterMiss is called when a kid was not in seen, the ring a
// verification used. It returns the ring to retry with, or nil when there
// is nothing new to try: if another caller replaced the ring meanwhile (a
// concurrent miss fetched it), that ring is returned without a fetch;
// otherwise the key set is fetched unless an on-demand fetch was made less
// than minInterval ago. The fetch does not follow ctx's cancellation (it is
// bounded by the fetch timeout alone): it spends the interval for every
// caller, and a rogue's check on a request it had already abandoned (a
// made-up kid, a cancelled context) spent it on a fetch that failed at
// once, so tokens of a key rotated in were refused as unknown until the
// scheduled refetch.
func (c *jwksCache) refreshAfterMiss(ctx context.Context, seen *capability.KeyRing) (*capability.KeyRing, error) {
	ctx = context.WithoutCancel(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if current := c.ring.Load(); current != seen {
		return current, nil
	}
	now := c.now()
	if !c.lastOnDemand.IsZero() && now.Sub(c.lastOnDemand) < c.minInterval {
		return nil, nil
	}
	c.lastOnDemand = now
	if err := c.fetchLocked(ctx); err != nil {
		return nil, err
	}
	return c.ring.Load(), nil
}

// refresh fetches the key set now.
func (c *jwksCache) refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetchLocked(ctx)
}

func (c *jwksCache) fetchLocked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return fmt.Errorf("agentsdk: jwks: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agentsdk: fetch jwks: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agentsdk: fetch jwks: %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return fmt.Errorf("agentsdk: fetch jwks: %w", err)
	}
	if len(body) > maxJWKSBytes {
		return errors.New("agentsdk: fetch jwks: key set larger than 1 MiB")
	}
	ring, err := capability.ParseJWKS(body)
	if err != nil {
		return err
	}
	c.ring.Store(&ring)
	return nil
}
