package controlplane_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// reflectedMethod resolves a method through server reflection alone, the
// way grpcurl does without a copy of the protos.
func reflectedMethod(t *testing.T, stream *grpcreflect.ClientStream, service, method string) protoreflect.MethodDescriptor {
	t.Helper()
	fds, err := stream.FileContainingSymbol(protoreflect.FullName(service))
	if err != nil {
		t.Fatalf("reflection: file containing %s: %v", service, err)
	}
	files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: fds})
	if err != nil {
		t.Fatalf("reflection: descriptors of %s do not resolve: %v", service, err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		t.Fatal(err)
	}
	m := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
	if m == nil {
		t.Fatalf("reflection: %s has no method %s", service, method)
	}
	return m
}

// TestReflectionListsAndCallsServicesWithoutProtos is `grpcurl -plaintext
// ADDR list` and `grpcurl ... grpc.health.v1.Health/Check`: a reflection
// client, without a token, lists every service, and a plain gRPC client
// calls the standard health service and a Tether service with messages built
// only from the reflected descriptors. Reflection opens no door: the Tether
// call still needs a token.
func TestReflectionListsAndCallsServicesWithoutProtos(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	for _, protocol := range []struct {
		name string
		opt  connect.ClientOption
	}{{"grpc", connect.WithGRPC()}, {"connect", nil}} {
		t.Run(protocol.name, func(t *testing.T) {
			var opts []connect.ClientOption
			if protocol.opt != nil {
				opts = append(opts, protocol.opt)
			}
			stream := grpcreflect.NewClient(srv.HTTP, srv.URL, opts...).NewStream(ctx)
			defer stream.Close()
			names, err := stream.ListServices()
			if err != nil {
				t.Fatalf("list services: %v", err)
			}
			for _, want := range []protoreflect.FullName{
				"tether.v1.AgentService", "tether.v1.AuthService", "tether.v1.CapabilityService", "tether.v1.ToolService",
				"tether.v1.SupervisorService", "tether.v1.LeaseService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
			} {
				if !slices.Contains(names, want) {
					t.Fatalf("reflection lists %v, missing %s", names, want)
				}
			}
		})
	}

	stream := grpcreflect.NewClient(srv.HTTP, srv.URL, connect.WithGRPC()).NewStream(ctx)
	defer stream.Close()
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(ctx context.Context, m protoreflect.MethodDescriptor, fill func(protoreflect.Message)) (*dynamicpb.Message, error) {
		req := dynamicpb.NewMessage(m.Input())
		if fill != nil {
			fill(req)
		}
		resp := dynamicpb.NewMessage(m.Output())
		err := conn.Invoke(ctx, "/"+string(m.Parent().FullName())+"/"+string(m.Name()), req, resp)
		return resp, err
	}

	check := reflectedMethod(t, stream, "grpc.health.v1.Health", "Check")
	for _, service := range []string{"", "tether.v1.LeaseService"} {
		resp, err := call(ctx, check, func(m protoreflect.Message) {
			m.Set(m.Descriptor().Fields().ByName("service"), protoreflect.ValueOfString(service))
		})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		got := resp.Get(check.Output().Fields().ByName("status")).Enum()
		if name := check.Output().Fields().ByName("status").Enum().Values().ByNumber(got).Name(); name != "SERVING" {
			t.Fatalf("health check %q = %s, want SERVING", service, name)
		}
	}
	if _, err := call(ctx, check, func(m protoreflect.Message) {
		m.Set(m.Descriptor().Fields().ByName("service"), protoreflect.ValueOfString("tether.v1.NoSuchService"))
	}); status.Code(err) != codes.NotFound {
		t.Fatalf("health check of an unknown service: %v, want NotFound", err)
	}

	whoami := reflectedMethod(t, stream, "tether.v1.AuthService", "WhoAmI")
	if _, err := call(ctx, whoami, nil); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("WhoAmI without a token: %v, want Unauthenticated", err)
	}
	resp, err := call(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+srv.Admin), whoami, nil)
	if err != nil {
		t.Fatalf("WhoAmI with the admin token: %v", err)
	}
	if !strings.Contains(resp.String(), "admin") {
		t.Fatalf("WhoAmI answered %v", resp)
	}
}
