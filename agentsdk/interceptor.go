package agentsdk

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// BearerInterceptor is the client side of authentication: it presents
// Token() as "Authorization: Bearer <token>" on every request, and nothing
// when Token() is "". Dial installs it; use it directly only to build a
// client of a single service.
//
// An error of the call (or the stream) carries neither the token it sent
// nor that token's signature: a peer that echoes the request it refused
// (a proxy, or a hostile control plane) would otherwise put a usable copy
// of the credential in the error's message, metadata or details, and from
// there in the caller's logs (withoutBearer).
type BearerInterceptor struct{ Token func() string }

// WrapUnary implements connect.Interceptor.
func (b BearerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		token := b.present(req.Header())
		resp, err := next(ctx, req)
		return resp, withoutBearer(err, token)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if token := b.present(conn.RequestHeader()); token != "" {
			return bearerStream{StreamingClientConn: conn, token: token}
		}
		return conn
	}
}

// bearerStream is a stream whose errors carry neither the token it was
// opened with nor its signature.
type bearerStream struct {
	connect.StreamingClientConn
	token string
}

func (s bearerStream) Send(msg any) error {
	return withoutBearer(s.StreamingClientConn.Send(msg), s.token)
}

func (s bearerStream) Receive(msg any) error {
	return withoutBearer(s.StreamingClientConn.Receive(msg), s.token)
}

func (s bearerStream) CloseRequest() error {
	return withoutBearer(s.StreamingClientConn.CloseRequest(), s.token)
}

func (s bearerStream) CloseResponse() error {
	return withoutBearer(s.StreamingClientConn.CloseResponse(), s.token)
}

// WrapStreamingHandler implements connect.Interceptor.
func (b BearerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// present sets the Authorization header and returns the token it sent.
func (b BearerInterceptor) present(h http.Header) string {
	t := b.Token()
	if t != "" {
		h.Set("Authorization", "Bearer "+t)
	}
	return t
}

// tokenSignature is a token's signature, the part after its last dot: a
// JWT's header and claims are not secret, its signature makes a copy of
// it usable. "" when the token has no dot or the part is too short to be
// told from ordinary text. The one definition the bearer token's and the
// tool gate's redaction share (the TypeScript and Python SDKs' too).
func tokenSignature(token string) string {
	i := strings.LastIndex(token, ".")
	if i < 0 || len(token)-i-1 < 16 {
		return ""
	}
	return token[i+1:]
}

// withoutSecret cuts token, and its signature, out of s, naming what was
// cut ("[what]", "[what signature]").
func withoutSecret(s, token, what string) string {
	if token == "" {
		return s
	}
	s = strings.ReplaceAll(s, token, "["+what+"]")
	if sig := tokenSignature(token); sig != "" {
		s = strings.ReplaceAll(s, sig, "["+what+" signature]")
	}
	return s
}

// withoutBearer returns err, or when its message, its metadata or its
// details carry token or token's signature, a new error of the same code
// (a wire error still one) without them: the message and metadata with
// both cut out, the details that carry either left out (a detail is
// Protobuf bytes: text cannot be cut out of it and leave it whole). The
// new error wraps nothing, so no chained error carries them either.
//
// err itself is never written to: a stream can hand the same *connect.Error
// to more than one caller, and its Meta writes a map on first use. Only a
// wire error's metadata is read, which connect fills from the peer's
// headers and trailers when it receives the error; any other error's
// metadata is the client's own.
func withoutBearer(err error, token string) error {
	if err == nil || token == "" {
		return err
	}
	sig := tokenSignature(token)
	holds := func(s string) bool { return strings.Contains(s, token) || sig != "" && strings.Contains(s, sig) }
	var ce *connect.Error
	if !errors.As(err, &ce) {
		if holds(err.Error()) {
			return errors.New(withoutSecret(err.Error(), token, "bearer token"))
		}
		return err
	}
	wire := connect.IsWireError(ce)
	var meta http.Header
	if wire {
		meta = ce.Meta()
	}
	dirty := holds(err.Error())
	for k, vs := range meta {
		dirty = dirty || holds(k) || holds(strings.Join(vs, "\n"))
	}
	for _, d := range ce.Details() {
		dirty = dirty || holds(d.Type()) || holds(string(d.Bytes()))
	}
	if !dirty {
		return err
	}
	cause := errors.New(withoutSecret(ce.Message(), token, "bearer token"))
	out := connect.NewError(ce.Code(), cause)
	if wire {
		out = connect.NewWireError(ce.Code(), cause)
	}
	for k, vs := range meta {
		for _, v := range vs {
			out.Meta().Add(withoutSecret(k, token, "bearer token"), withoutSecret(v, token, "bearer token"))
		}
	}
	for _, d := range ce.Details() {
		if !holds(d.Type()) && !holds(string(d.Bytes())) {
			out.AddDetail(d)
		}
	}
	return out
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
