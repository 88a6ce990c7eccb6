package controlplane

import (
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
)

// mountReflection serves gRPC server reflection (v1 and v1alpha), so that
// grpcurl, buf curl and Postman list and call the services without a copy
// of the protos.
//
// Reflection is public, like health: it answers with the descriptors of
// the services listed here — the same .proto files the repository
// publishes — and nothing else (no data, no configuration, no principal).
// It passes through the observer (span, metrics, log) but not through
// authentication; its messages are bounded tighter than the API's
// (MaxPublicMessageBytes), inflated ones too (publicMessages), and each
// costs the caller's address one request of the budget of requests without
// a valid credential (auth.Interceptor.Public): a stream of them is not
// free work.
func (s *Server) mountReflection(mux *http.ServeMux, obs *observer) {
	names := append(serviceNames(), grpchealth.HealthV1ServiceName, grpcreflect.ReflectV1ServiceName)
	reflector := grpcreflect.NewStaticReflector(names...)
	opts := []connect.HandlerOption{connect.WithInterceptors(obs, s.authn.Public()), publicMessages(s.cfg.MaxRequestBytes)}
	mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
}

// checkOnly is a health checker that answers Check and not Watch: the
// handler answers Watch unimplemented at once, which gRPC's
// health-checking clients read as "the server is healthy". The control
// plane never changes a service's status, so a Watch was Check's answer
// and then a stream held open, without a credential or any budget, until
// its write timeout — eight on every connection anyone may open — each a
// watcher the checker keeps in a list that a watch's end walks under the
// lock every Check takes (at 80,000 watchers, 88 µs a watch opened and
// ended, against 0.36 µs at none; rogue48g test
// TestRogue48GHealthWatchIsNotAFreeStream).
type checkOnly struct{ grpchealth.Checker }
