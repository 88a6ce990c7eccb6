package mcpgate

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// tokenKey holds the raw capability token in auth.TokenInfo.Extra, for the
// per-call checks (the bearer of each HTTP request: a refreshed token is
// used from the next request on).
const tokenKey = "tether_capability_token"

// EndpointPath is where Handler serves MCP.
const EndpointPath = "/mcp"

// MetadataPath is where Handler serves the OAuth protected-resource
// metadata (RFC 9728) that MCP clients read to learn how to authenticate;
// it is also served under MetadataPath + EndpointPath.
const MetadataPath = "/.well-known/oauth-protected-resource"

// HTTPOptions configures Handler.
type HTTPOptions struct {
	// BaseURL is the gateway's public URL (scheme://host:port), the base
	// of the resource identifier in the protected-resource metadata.
	BaseURL string
	// AuthorizationServers are listed in the metadata (e.g. the control
	// plane's URL when it issues the agents' tokens); may be empty.
	AuthorizationServers []string
}

// Handler serves the gateway as a Streamable HTTP MCP endpoint at
// EndpointPath. Every request must carry the agent's capability token as
// its bearer; a request without a valid one gets 401 with a
// WWW-Authenticate header pointing at the protected-resource metadata, and
// every request gets 503 while the revocation feed is stale. A revoked
// token passes this door and is refused by the MCP request it carries,
// with the reason (CodeDenied). A session belongs to the node that holds
// the token that opened it.
func (g *Gateway) Handler(opts HTTPOptions) http.Handler {
	base := strings.TrimRight(opts.BaseURL, "/")
	meta := &oauthex.ProtectedResourceMetadata{
		Resource:               base + EndpointPath,
		AuthorizationServers:   opts.AuthorizationServers,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Tether MCP gateway",
		ScopesSupported:        g.Scopes(),
	}
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{})
	bearer := auth.RequireBearerToken(g.verifyBearer, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: base + MetadataPath + EndpointPath,
	})(mcpHandler)
	mux := http.NewServeMux()
	mux.Handle(MetadataPath, auth.ProtectedResourceMetadataHandler(meta))
	mux.Handle(MetadataPath+EndpointPath, auth.ProtectedResourceMetadataHandler(meta))
	mux.Handle(EndpointPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Fail closed before anything else when revocations may be unknown.
		if err := g.cfg.Verifier.Fresh(); err != nil {
			http.Error(w, "tether: the gateway has not heard the control plane's revocation feed recently; retry later", http.StatusServiceUnavailable)
			return
		}
		bearer.ServeHTTP(w, r)
	}))
	return mux
}

// verifyBearer is the auth.TokenVerifier: the capability token's signature
// and expiry, checked offline. Revocation and scopes are checked per MCP
// request (tools/list, tools/call), where the refusal can say why. The
// session's user is the node that holds the grant, so another node's
// token cannot ride on a session it did not open.
func (g *Gateway) verifyBearer(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	claims, err := g.cfg.Verifier.Identify(ctx, token)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
	}
	return &auth.TokenInfo{
		Scopes:     claims.Scopes,
		Expiration: claims.ExpiresAt,
		UserID:     claims.HolderNodeID,
		Extra:      map[string]any{tokenKey: token},
	}, nil
}
