package controlplane

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
)

// A handler reached without an authenticated caller fails closed: it does
// not act as an operator with an empty name.
func TestPrincipalOfFailsClosed(t *testing.T) {
	for name, ctx := range map[string]context.Context{
		"no principal":   context.Background(),
		"zero principal": auth.WithPrincipal(context.Background(), auth.Principal{}),
		"no kind":        auth.WithPrincipal(context.Background(), auth.Principal{Subject: "alice", Role: auth.RoleAdmin}),
	} {
		p, err := principalOf(ctx)
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: principalOf = %+v, %v; want Unauthenticated", name, p, err)
		}
		if _, err := grantCaller(ctx); !errors.Is(err, errNoPrincipal) {
			t.Errorf("%s: grantCaller error = %v, want errNoPrincipal", name, err)
		}
	}
	want := auth.Principal{Kind: auth.KindOperator, Subject: "alice", Role: auth.RoleAdmin}
	p, err := principalOf(auth.WithPrincipal(context.Background(), want))
	if err != nil || p.ID() != "operator:alice" {
		t.Fatalf("principalOf(alice) = %+v, %v", p, err)
	}
}
