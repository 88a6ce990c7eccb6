package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Interceptor authenticates every request and applies the Policy.
type Interceptor struct {
	Issuer Issuer
	Policy Policy
	Now    func() time.Time
	// AgentActive returns nil when an agent credential's node may still act;
	// an error wrapping ErrRevoked when the node is terminated or unknown.
	AgentActive func(ctx context.Context, nodeID string) error
	// Limiter bounds the request rate of each principal (nil: unlimited).
	Limiter *RateLimiter
	// Cache remembers verified tokens (nil: verify every request).
	Cache *TokenCache
	// RateLimited, if set, is told of each request the Limiter refused,
	// with its procedure (metrics; it must return quickly).
	RateLimited func(procedure string)
}

var _ connect.Interceptor = (*Interceptor)(nil)

// Authenticate checks the request's credential and the procedure's rule and
// returns the context carrying the principal.
func (i *Interceptor) Authenticate(ctx context.Context, procedure string, header http.Header) (context.Context, error) {
	token, err := bearer(header)
	if err != nil {
		return ctx, connect.NewError(connect.CodeUnauthenticated, err)
	}
	p, err := i.Cache.Parse(i.Issuer, token, i.Now())
	if err != nil {
		return ctx, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if p.IsAgent() && i.AgentActive != nil {
		if err := i.AgentActive(ctx, p.Subject); err != nil {
			if errors.Is(err, ErrRevoked) {
				return ctx, connect.NewError(connect.CodeUnauthenticated, err)
			}
			return ctx, connect.NewError(connect.CodeUnavailable, fmt.Errorf("auth: cannot check the agent's node: %w", err))
		}
	}
	rule, ok := i.Policy[procedure]
	if !ok {
		return ctx, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%w: %s has no authorisation rule", ErrDenied, procedure))
	}
	if !rule.Allows(p) {
		who := "role " + p.Role.String()
		if p.IsAgent() {
			who = "agents"
		}
		return ctx, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%w: %s may not call %s", ErrDenied, who, procedure))
	}
	if ok, wait := i.Limiter.Allow(p.ID()); !ok {
		if i.RateLimited != nil {
			i.RateLimited(procedure)
		}
		err := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: rate limit for %s exceeded; retry in %s", p.ID(), wait.Round(time.Millisecond)))
		return ctx, err
	}
	return WithPrincipal(ctx, p), nil
}

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := i.Authenticate(ctx, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := i.Authenticate(ctx, conn.Spec().Procedure, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

func bearer(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", ErrNoCredential
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: Authorization header must be \"Bearer <token>\"", ErrBadCredential)
	}
	return strings.TrimSpace(token), nil
}

// BearerInterceptor is the client side: it adds the token to every request.
type BearerInterceptor struct{ Token func() string }

// WrapUnary implements connect.Interceptor.
func (b BearerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			req.Header().Set("Authorization", "Bearer "+b.Token())
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+b.Token())
		return conn
	}
}

// WrapStreamingHandler implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
