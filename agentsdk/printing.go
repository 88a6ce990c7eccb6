package agentsdk

import (
	"fmt"
	"log/slog"
	"time"
)

// What the SDK's objects that hold a secret print: fmt (%v, %+v, %s,
// %#v) and slog (text or JSON) show who and what they are, never the
// bearer token, credential or capability token they hold. fmt printed a
// *Conn whole, its token included, a Child with its credential, and %#v
// or a JSON log line a Grant's token; whoever reads the logs (a rogue
// among them) could use it. Marshalling one with encoding/json on purpose
// still carries it (a Child handed to its process).

// String describes the connection by its address.
func (c *Conn) String() string { return "agentsdk.Conn(" + c.BaseURL + ")" }

// GoString is String.
func (c *Conn) GoString() string { return c.String() }

// LogValue is String.
func (c *Conn) LogValue() slog.Value { return slog.StringValue(c.String()) }

// String describes the child by its node, without its credential.
func (c Child) String() string {
	return fmt.Sprintf("agentsdk.Child(%s %s, credential not shown)", c.Node.GetName(), c.Node.GetNodeId())
}

// GoString is String.
func (c Child) GoString() string { return c.String() }

// LogValue is String.
func (c Child) LogValue() slog.Value { return slog.StringValue(c.String()) }

// GoString describes the grant by its id and expiry, without its token
// (String is the grant message's).
func (g Grant) GoString() string {
	return fmt.Sprintf("agentsdk.Grant(%s, token not shown, expires %s)", g.GetGrantId(), g.ExpiresAt.UTC().Format(time.RFC3339))
}

// LogValue is GoString.
func (g Grant) LogValue() slog.Value { return slog.StringValue(g.GoString()) }

// String describes the token's grant, without the token.
func (t *CapabilityToken) String() string {
	t.mu.Lock()
	g := t.grant
	t.mu.Unlock()
	return fmt.Sprintf("agentsdk.CapabilityToken(%s, token not shown, expires %s)", g.GetGrantId(), g.ExpiresAt.UTC().Format(time.RFC3339))
}

// GoString is String.
func (t *CapabilityToken) GoString() string { return t.String() }

// LogValue is String.
func (t *CapabilityToken) LogValue() slog.Value { return slog.StringValue(t.String()) }
