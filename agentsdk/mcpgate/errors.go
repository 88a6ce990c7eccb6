package mcpgate

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
)

// JSON-RPC error codes the gateway answers with, in the
// implementation-defined server range (-32000 to -32099) away from the
// codes the MCP SDKs give meanings of their own (-32000 to -32005, -32020
// to -32022, -32042). Every message starts with "tether:" and says why, in
// the agent's vocabulary; none contains a token. An upstream's error with
// a code from -32069 to -32061 reaches the agent as jsonrpc.CodeInternalError
// naming the upstream: these codes are the gateway's alone.
const (
	// CodeUnauthenticated: no capability token, or one that does not verify.
	CodeUnauthenticated = -32061
	// CodeTooManyConnections: the token holder already holds the
	// gateway's maximum of connections open (HTTPOptions.MaxConnsPerNode);
	// send over one it holds, or close one. Answered with HTTP 429, and the
	// connection closed.
	CodeTooManyConnections = -32062
	// CodeDenied: the token's grant does not allow the tool, or is revoked
	// or expired.
	CodeDenied = -32063
	// CodeStopping: the token holder's subtree is draining or aborting; new
	// calls are refused.
	CodeStopping = -32064
	// CodeCancelled: the control plane cancelled the call in flight.
	CodeCancelled = -32065
	// CodeUnavailable: the gateway cannot decide now (the revocation feed is
	// stale, the control plane or the upstream is unreachable). Fail closed;
	// retry later.
	CodeUnavailable = -32066
	// CodeTooManySessions: the token holder already has the gateway's
	// maximum of MCP sessions open; close one (DELETE) or let one idle out.
	CodeTooManySessions = -32067
	// CodeTooManyCalls: the token holder already has the gateway's maximum
	// of tool calls in flight through it; wait for one to end.
	CodeTooManyCalls = -32068
	// CodeTooManyBodyBytes: the token holder's request bodies held by the
	// gateway would exceed its maximum (HTTPOptions.MaxBodyBytesPerNode);
	// wait for its requests to end, or send smaller ones. Answered with
	// HTTP 429, and the connection closed.
	CodeTooManyBodyBytes = -32069
	// CodeNotGated: resources and prompts are refused (only tools pass).
	CodeNotGated = jsonrpc.CodeMethodNotFound
)

func rpcError(code int64, format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: code, Message: "tether: " + fmt.Sprintf(format, args...)}
}

// verifierRefusal maps an offline verification error to the agent's error.
func verifierRefusal(err error) *jsonrpc.Error {
	switch {
	case errors.Is(err, capability.ErrFeedStale):
		return rpcError(CodeUnavailable, "the gateway has not heard the control plane's revocation feed recently, so it refuses every call until it does (%v)", err)
	case errors.Is(err, agentsdk.ErrScopeNotGranted),
		errors.Is(err, agentsdk.ErrTreeNotFollowed),
		errors.Is(err, capability.ErrGrantRevoked),
		errors.Is(err, capability.ErrTokenExpired):
		return rpcError(CodeDenied, "%v", err)
	default:
		return rpcError(CodeUnauthenticated, "the capability token does not verify: %v", err)
	}
}

// beginRefusal maps the control plane's refusal of BeginCall.
func beginRefusal(err error) *jsonrpc.Error {
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	switch connect.CodeOf(err) {
	case connect.CodeFailedPrecondition:
		return rpcError(CodeStopping, "the call is refused because the agent is being stopped: %s", msg)
	case connect.CodePermissionDenied:
		return rpcError(CodeDenied, "%s", msg)
	case connect.CodeUnauthenticated:
		// The gateway's own credential, not the agent's: BeginCall reports a
		// bad capability token as permission_denied.
		return rpcError(CodeUnavailable, "the control plane refused the gateway's own credential, so the call was not made: %s", msg)
	default:
		return rpcError(CodeUnavailable, "the control plane could not record the call, so it was not made: %s", msg)
	}
}
