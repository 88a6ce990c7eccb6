package agentsdk

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"
)

// BearerInterceptor is the client side of authentication: it presents
// Token() as "Authorization: Bearer <token>" on every request, and nothing
// when Token() is "". Dial installs it; use it directly only to build a
// client of a single service.
type BearerInterceptor struct{ Token func() string }

// WrapUnary implements connect.Interceptor.
func (b BearerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			b.present(req.Header())
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		b.present(conn.RequestHeader())
		return conn
	}
}

// WrapStreamingHandler implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (b BearerInterceptor) present(h http.Header) {
	if t := b.Token(); t != "" {
		h.Set("Authorization", "Bearer "+t)
	}
}

// unaryTimeout gives a unary call whose context has no deadline one of its
// length (Dial installs it, from WithTimeout): without it such a call
// waited for as long as the control plane held its answer. A context's own
// deadline, shorter or longer, is left as it is, and streams are meant to
// stay open.
type unaryTimeout time.Duration

// WrapUnary implements connect.Interceptor.
func (d unaryTimeout) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if _, ok := ctx.Deadline(); !ok && req.Spec().IsClient {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(d))
			defer cancel() // a unary answer is read whole before next returns
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (unaryTimeout) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (unaryTimeout) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
