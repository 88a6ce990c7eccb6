package controlplane

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// buildComponents creates the domain services on top of the store, in
// dependency order, and registers their background loops.
func (s *Server) buildComponents(ctx context.Context) error {
	return nil
}

// mountServices registers one Connect handler per service.
func (s *Server) mountServices(mux *http.ServeMux, opts []connect.HandlerOption) {
	mux.Handle(tetherv1connect.NewAuthServiceHandler(&authService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewAgentServiceHandler(&agentService{s: s}, opts...))
	mux.Handle(tetherv1connect.NewCapabilityServiceHandler(&tetherv1connect.UnimplementedCapabilityServiceHandler{}, opts...))
	mux.Handle(tetherv1connect.NewLeaseServiceHandler(&tetherv1connect.UnimplementedLeaseServiceHandler{}, opts...))
	mux.Handle(tetherv1connect.NewToolServiceHandler(&tetherv1connect.UnimplementedToolServiceHandler{}, opts...))
	mux.Handle(tetherv1connect.NewSupervisorServiceHandler(&tetherv1connect.UnimplementedSupervisorServiceHandler{}, opts...))
}
