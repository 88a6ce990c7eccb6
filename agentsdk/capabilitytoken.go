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
// Concurrent callers share one refresh. A refusal — the grant was revoked
// or expired, the node is stopping — is returned to the caller: there is
// no token to use.
type CapabilityToken struct {
	agent *Agent
	now   func() time.Time

	mu       sync.Mutex
	grant    Grant
	issuedAt time.Time
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
// first when needed.
func (t *CapabilityToken) Token(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	life := max(t.grant.ExpiresAt.Sub(t.issuedAt), 0)
	if t.grant.ExpiresAt.Sub(now) > life/3 {
		return t.grant.Token, nil
	}
	fresh, err := t.agent.RefreshToken(ctx, t.grant.GetGrantId())
	if err != nil {
		return "", err
	}
	t.grant, t.issuedAt = fresh, now
	return fresh.Token, nil
}

// Grant is the grant as last refreshed.
func (t *CapabilityToken) Grant() Grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.grant
}
