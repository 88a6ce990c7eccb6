package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue39BAStreamCannotKeepDeclaredTrailers: a stream keeps its
// request for as long as it lives (days, for a feed or a session), and the
// request's Trailer header, which net/http takes out of the headers, is
// kept as a map of the trailer names it declares (Request.Trailer), an
// entry each, before any handler runs; and once a stream declared one, Go's
// HTTP/2 server keeps every trailer field the client sends at its
// request's end (up to --max-header-bytes, declared or not) in a map of the
// stream's. The stream header bound (MaxStreamHeaderFields,
// MaxStreamHeaderBytes; rogue30e test
// TestRogue30EAStreamCannotKeepLargeHeaders) counted the headers only: one
// Trailer field of 52 KB, within --max-header-bytes, declared 9,000 names,
// which held some 850 KB of the server's heap a stream for its life
// (measured in process over 20 such streams) — over the streams a lineage
// may hold (its share, 5,000 by default, and four a node), gigabytes. No
// stream of this server takes request trailers (Connect ends a client
// stream with a message, gRPC with END_STREAM, and none of the SDKs sends
// any): a stream whose request declares one is now refused,
// invalid_argument, and one that declares none has any trailer it is sent
// dropped by the HTTP/2 server.
func TestRogue39BAStreamCannotKeepDeclaredTrailers(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	rogue := register(t, srv.AdminClients(), "rogue39b")
	c := srv.Clients(rogue.Credential)
	principal := "agent:" + rogue.Node.NodeId
	open := func(trailer string) error {
		ctx, cancel := context.WithTimeout(context.Background(), closeWait) // a guard against a hang, not a timing
		defer cancel()
		req := connect.NewRequest(&tetherv1.WatchRevocationsRequest{})
		if trailer != "" {
			req.Header().Set("Trailer", trailer)
		}
		stream, err := c.Capability.WatchRevocations(ctx, req)
		if err != nil {
			return err
		}
		defer stream.Close()
		if !stream.Receive() {
			return stream.Err()
		}
		return nil
	}
	names := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "X%d", i)
		}
		return b.String()
	}
	// An honest stream, declaring no trailer, is served.
	if err := open(""); err != nil {
		t.Fatalf("an honest stream: %v", err)
	}
	for _, tc := range []struct{ name, trailer string }{
		{"a field of many names", names(9000)},
		{"one name", "X-Checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := open(tc.trailer)
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("a stream declaring %d trailers: %v, want invalid_argument", strings.Count(tc.trailer, ",")+1, err)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || !strings.Contains(ce.Message(), "trailer") {
				t.Errorf("the refusal does not say what was refused: %v", err)
			}
			testserver.WaitFor(t, closeWait, "the refused stream's slot to be free", func() bool { return srv.OpenStreams(principal) == 0 })
		})
	}
}
