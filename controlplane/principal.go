package controlplane

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
)

// errNoPrincipal answers a request that reached a handler without an
// authenticated caller. The interceptor makes that unreachable; if it ever
// is reached, the request fails closed instead of acting for nobody.
var errNoPrincipal = connect.NewError(connect.CodeUnauthenticated, errors.New("the request carries no authenticated caller; present a token"))

// principalOf returns the authenticated caller of ctx, or errNoPrincipal.
// Handlers read the principal only through it (fail closed), never with
// `p, _ := auth.FromContext(ctx)`, whose zero value is nobody's.
func principalOf(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || p.ID() == "" {
		return auth.Principal{}, errNoPrincipal
	}
	return p, nil
}
