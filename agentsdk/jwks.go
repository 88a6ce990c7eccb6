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
// kids cannot turn into a flood of fetches.
type jwksCache struct {
	url         string
	http        *http.Client
	now         func() time.Time
	minInterval time.Duration

	ring atomic.Pointer[capability.KeyRing]

	mu          sync.Mutex // serializes fetches
	lastAttempt time.Time
}

func newJWKSCache(baseURL string, hc *http.Client, now func() time.Time, minInterval time.Duration) *jwksCache {
	c := &jwksCache{url: baseURL + JWKSPath, http: hc, now: now, minInterval: minInterval}
	c.ring.Store(&capability.KeyRing{})
	return c
}

// keys returns the cached ring, a capability.KeyLookup.
func (c *jwksCache) keys() capability.KeyRing { return *c.ring.Load() }

// refreshIfAllowed fetches the key set unless a fetch was attempted less
// than minInterval ago. It reports whether the set was fetched.
func (c *jwksCache) refreshIfAllowed(ctx context.Context) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if !c.lastAttempt.IsZero() && now.Sub(c.lastAttempt) < c.minInterval {
		return false, nil
	}
	c.lastAttempt = now
	return true, c.fetchLocked(ctx)
}

// refresh fetches the key set now.
func (c *jwksCache) refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastAttempt = c.now()
	return c.fetchLocked(ctx)
}

func (c *jwksCache) fetchLocked(ctx context.Context) error {
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
