package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

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
			r := newStallRogue(t, addr)
			defer r.c.Close()
			// The same request declaring a few names still waits for the
			// window its answer needs (flow control bounds it as before):
			// the rogue is judged on what it declared, not on its window.
			few := sendRaw(t, r, tc.method, tc.path, tc.cred, [2]string{"trailer", trailerNames(controlplane.MaxDeclaredTrailers)})
			many := sendRaw(t, r, tc.method, tc.path, tc.cred, [2]string{"trailer", trailerNames(9000)})
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

// sendRaw sends a request, ended, of method to path with cred ("" for
// none) and the header extra, its header block in frames of at most
// 16 KiB (a HEADERS, then CONTINUATIONs), and returns its stream's id.
func sendRaw(t *testing.T, r *stallRogue, method, path, cred string, extra [2]string) uint32 {
	t.Helper()
	fields := [][2]string{{":method", method}, {":path", path}}
	if method == "POST" {
		fields = append(fields, [2]string{"content-type", "application/json"})
	}
	if cred != "" {
		fields = append(fields, [2]string{"authorization", "Bearer " + cred})
	}
	if extra[0] != "" {
		fields = append(fields, extra)
	}
	id, err := openRaw(r, true, fields...)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRogue39BCLongRequestTargetIsNotKeptWaitingForItsAnswer: a refusal
// waiting to be written drops its request's headers (rogue32e test
// TestRogue32EARefusalWaitingToBeWrittenDoesNotKeepItsHeaders), but not
// its request-target, which net/http keeps in the request (RequestURI, and
// the URL parsed from it) and which may fill --max-header-bytes on its
// own: a client granting no window had eight refusals on each connection
// without a credential (controlplane.PreAuthRequests) each keep 60 KB of
// path or query while it waited to be written — a call to a path under a
// tether service refused by the Gate, GET /healthz with a long query, a
// 404 — the 480 KB a connection that test took away, over every
// connection the server takes without a credential. No procedure, console
// page or public endpoint has a target near controlplane.MaxRequestTarget
// bytes; a request whose target is longer is now answered 414 in headers
// alone (which flow control does not hold) before anything else is done
// for it: its stream ends though the client grants no window.
func TestRogue39BCLongRequestTargetIsNotKeptWaitingForItsAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.Conn.PreAuthTimeout = time.Hour
		cfg.Conn.WriteTimeout = time.Hour
		cfg.Conn.ReadTimeout = time.Hour
	})
	addr := hostOf(t, srv.URL)
	long := strings.Repeat("x", 60<<10)
	for _, tc := range []struct{ name, method, path string }{
		{"a call refused by the Gate", "POST", "/tether.v1.AgentService/" + long},
		{"a public answer's query", "GET", "/healthz?" + long},
		{"a page not found", "GET", "/" + long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStallRogue(t, addr)
			defer r.c.Close()
			// A short one still waits for the window its answer needs.
			short := sendRaw(t, r, tc.method, tc.path[:controlplane.MaxRequestTarget], "not-a-credential", [2]string{})
			id := sendRaw(t, r, tc.method, tc.path, "not-a-credential", [2]string{})
			testserver.WaitFor(t, closeWait, "the stream of the long target to end", func() bool {
				_, ok := r.ended.Load(id)
				return ok
			})
			if _, ok := r.ended.Load(short); ok {
				t.Errorf("the request of a %d-byte target ended without the window its answer needs: it was not served", controlplane.MaxRequestTarget)
			}
		})
	}
}
