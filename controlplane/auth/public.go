package auth

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
)

// Public is the interceptor of the services served without a credential
// (server reflection): each request it answers, and each message on one
// of its streams, costs the caller's address one request of the Anonymous
// budget, as a request without a valid credential does. A public
// bidirectional stream would otherwise answer, for free and for as long
// as its connection lasts, as fast as the caller sends.
func (i *Interceptor) Public() connect.Interceptor { return public{i} }

type public struct{ i *Interceptor }

// charge takes one request of peer's Anonymous budget.
func (p public) charge(peer string) error {
	if p.i.Anonymous == nil || peer == "" {
		return nil
	}
	if ok, wait := p.i.Anonymous.Allow(sourceBudget(peer)); !ok {
		return rateLimited("requests without a valid credential from "+sourceOf(peer), wait)
	}
	return nil
}

func (p public) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			if err := p.charge(req.Peer().Addr); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

func (p public) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (p public) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &publicConn{StreamingHandlerConn: conn, p: p})
	}
}

// publicConn charges each message it receives.
type publicConn struct {
	connect.StreamingHandlerConn
	p public
}

func (c *publicConn) Receive(m any) error {
	if err := c.StreamingHandlerConn.Receive(m); err != nil {
		return err
	}
	return c.p.charge(c.Peer().Addr)
}

// PublicHTTP is Public for a plain HTTP endpoint served without a
// credential whose answer is costly to make (the metrics): each request
// costs the caller's address one request of the Anonymous budget, and past
// it the answer is 429 with Retry-After.
func (i *Interceptor) PublicHTTP(next http.Handler) http.Handler {
	p := public{i}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.charge(r.RemoteAddr); err != nil {
			var ce *connect.Error
			if errors.As(err, &ce) {
				w.Header().Set(RetryAfterHeader, ce.Meta().Get(RetryAfterHeader))
				http.Error(w, ce.Message(), http.StatusTooManyRequests)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
