package agentsdk

import (
	"context"
	"sync"
	"time"
)

// CapabilityToken keeps a grant's token fresh for as long as the grant
// lives. A grant may live for hours, but each token minted for it lives a
// few minutes (capability.DefaultTokenTTL), so that a revocation stops it
// soon even where a tool server checks tokens offline. Token returns the
// current token, first refreshing it (CapabilityService.Refresh, which
// re-checks the whole chain) once less than a third of its life is left.
// Concurrent callers share one refresh, each waiting for it until its own
// context ends. A refusal — the grant was revoked
// or expired, the node is stopping — is returned to the caller: there is
// no token to use.
type CapabilityToken struct {
	agent *Agent
	now   func() time.Time

	mu       sync.Mutex
	grant    Grant
	issuedAt time.Time
	// refreshing is the refresh under way, if any (under mu): the callers
	// that find the token due wait for it, each until its own context
	// ends.
	refreshing *tokenRefresh
}

// tokenRefresh is one shared refresh: done is closed once token and err
// are set; callerLeft, its caller's context ended (a waiting caller then
// refreshes itself rather than take that caller's leaving as its own).
type tokenRefresh struct {
	done       chan struct{}
	token      string
	err        error
	callerLeft bool
}

// CapabilityTokenOption configures a CapabilityToken.
type CapabilityTokenOption func(*CapabilityToken)

// WithTokenClock sets the clock a CapabilityToken reads to decide when to
// refresh (default WallClock); tests inject a manual one.
func WithTokenClock(c Clock) CapabilityTokenOption {
	return func(t *CapabilityToken) { t.now = c.Now }
}

// CapabilityToken keeps g's token fresh (g as Delegate or RefreshToken
// returned it).
func (a *Agent) CapabilityToken(g Grant, opts ...CapabilityTokenOption) *CapabilityToken {
	t := &CapabilityToken{agent: a, now: WallClock.Now, grant: g}
	for _, o := range opts {
		o(t)
	}
	t.issuedAt = t.now()
	return t
}

// CapabilityTokenFor mints a first token for a grant the agent holds (by
// id, as a parent hands it over) and keeps it fresh.
func (a *Agent) CapabilityTokenFor(ctx context.Context, grantID string, opts ...CapabilityTokenOption) (*CapabilityToken, error) {
	g, err := a.RefreshToken(ctx, grantID)
	if err != nil {
		return nil, err
	}
	return a.CapabilityToken(g, opts...), nil
}

// Token returns a token with at least a third of its life left, refreshing
// first when needed. A caller that finds a refresh under way waits for it,
// or until its own context ends (it returns that context's error then):
// the refresh held the token's lock through its call, and a control plane
// slow to answer it (a rogue sibling spent the lineage's rate budget, and
// the refresh waited out the refusals' hints) held every caller past its
// own deadline (rogue39a test).
func (t *CapabilityToken) Token(ctx context.Context) (string, error) {
	for {
		t.mu.Lock()
		now := t.now()
		life := max(t.grant.ExpiresAt.Sub(t.issuedAt), 0)
		if t.grant.ExpiresAt.Sub(now) > life/3 {
			tok := t.grant.Token
			t.mu.Unlock()
			return tok, nil
		}
		if r := t.refreshing; r != nil {
			t.mu.Unlock()
			select {
			case <-r.done:
				if r.callerLeft {
					continue // its caller left, not this one: refresh anew
				}
				return r.token, r.err
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		r := &tokenRefresh{done: make(chan struct{})}
		t.refreshing = r
		grantID := t.grant.GetGrantId()
		t.mu.Unlock()

		fresh, err := t.agent.RefreshToken(ctx, grantID)
		t.mu.Lock()
		if err == nil {
			t.grant, t.issuedAt = fresh, now
			r.token = fresh.Token
		}
		r.err, r.callerLeft = err, err != nil && ctx.Err() != nil
		t.refreshing = nil
		close(r.done)
		t.mu.Unlock()
		return r.token, err
	}
}

// Grant is the grant as last refreshed.
func (t *CapabilityToken) Grant() Grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.grant
}
