package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
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
// dropped by the HTTP/2 server. (Before the fix both cases were served.)
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
	// An honest stream, declaring no trailer, is served.
	if err := open(""); err != nil {
		t.Fatalf("an honest stream: %v", err)
	}
	for _, tc := range []struct{ name, trailer string }{
		// Past them, any request is answered 431 before the Gate
		// (TestRogue39BBRequestDeclaringManyTrailersIsNotKeptWaitingForItsAnswer).
		{"as many names as any request may declare", trailerNames(controlplane.MaxDeclaredTrailers)},
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

// trailerNames is a Trailer header's value declaring n distinct names.
func trailerNames(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "X%d", i)
	}
	return b.String()
}

// TestRogue39BBRequestDeclaringManyTrailersIsNotKeptWaitingForItsAnswer:
// net/http keeps the trailer names a request declares (its Trailer
// header) as a map for the request's life, made before any handler runs:
// one field of 52 KB, within --max-header-bytes, declared 9,000 names,
// some 850 KB of heap. A client granting no flow-control window has a
// request's answer wait to be written until the write timeout (30 s), and
// the request with it: a refusal of a call without a credential, a public
// answer (GET /healthz), eight of them on each connection the server
// takes without a credential (controlplane.PreAuthRequests), some 6.8 MB a
// connection over the default cap of 10,000 connections; and an agent's
// admitted call's answer, over its lineage's share of answers being
// written. The headers of such a refusal were dropped (rogue32e test
// TestRogue32EARefusalWaitingToBeWrittenDoesNotKeepItsHeaders), not its
// declared trailers, which HTTP/2 keeps in the stream itself. A request
// declaring more than controlplane.MaxDeclaredTrailers names is now
// answered 431 at once, in headers alone (which flow control does not
// hold), before anything else is done for it: its stream ends and the map
// with it. Seen from the wire: the stream ends though the client grants no
// window.
func TestRogue39BBRequestDeclaringManyTrailersIsNotKeptWaitingForItsAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		// Neither the connection's window to authenticate nor the answers'
		// write deadlines may end what the rogue holds while it is judged.
		cfg.Conn.PreAuthTimeout = time.Hour
		cfg.Conn.WriteTimeout = time.Hour
		cfg.Conn.ReadTimeout = time.Hour
	})
	rogue := register(t, srv.AdminClients(), "rogue39b")
	addr := hostOf(t, srv.URL)
	for _, tc := range []struct {
		name, method, path, cred string
	}{
		{"a call without a credential", "POST", tetherv1connect.AgentServiceGetNodeProcedure, "not-a-credential"},
		{"a public answer", "GET", "/healthz", ""},
		{"an agent's call", "POST", tetherv1connect.AuthServiceWhoAmIProcedure, rogue.Credential},
	} {
		t.Run(tc.name, func(t *testing.T) {
			send := func(r *stallRogue, trailer string) uint32 {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.hbuf.Reset()
				fields := [][2]string{{":method", tc.method}, {":scheme", "http"}, {":authority", "tether"}, {":path", tc.path}}
				if tc.method == "POST" {
					fields = append(fields, [2]string{"content-type", "application/json"})
				}
				if tc.cred != "" {
					fields = append(fields, [2]string{"authorization", "Bearer " + tc.cred})
				}
				if trailer != "" {
					fields = append(fields, [2]string{"trailer", trailer})
				}
				for _, kv := range fields {
					_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1], Sensitive: kv[0] == "trailer"})
				}
				// In frames of at most 16 KiB: a HEADERS, then CONTINUATIONs.
				block := bytes.Clone(r.hbuf.Bytes())
				const frame = 16 << 10
				first := block[:min(frame, len(block))]
				rest := block[len(first):]
				id := r.next
				r.next += 2
				if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0, EndStream: true}); err != nil {
					t.Fatal(err)
				}
				for len(rest) > 0 {
					chunk := rest[:min(frame, len(rest))]
					rest = rest[len(chunk):]
					if err := r.fr.WriteContinuation(id, len(rest) == 0, chunk); err != nil {
						t.Fatal(err)
					}
				}
				return id
			}
			r := newStallRogue(t, addr)
			defer r.c.Close()
			// The same request declaring a few names still waits for the
			// window its answer needs (flow control bounds it as before):
			// the rogue is judged on what it declared, not on its window.
			few := send(r, trailerNames(controlplane.MaxDeclaredTrailers))
			many := send(r, trailerNames(9000))
			testserver.WaitFor(t, closeWait, "the stream declaring 9,000 trailers to end", func() bool {
				_, ok := r.ended.Load(many)
				return ok
			})
			if tc.method == "POST" {
				if _, ok := r.ended.Load(few); ok {
					t.Errorf("the call declaring %d trailers ended without the window its answer needs: it was not served", controlplane.MaxDeclaredTrailers)
				}
			}
		})
	}
}
