package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// windowRogue speaks raw HTTP/2, grants the server no flow-control window
// for its answers (SETTINGS_INITIAL_WINDOW_SIZE 0), answers the server's
// pings and settings as a live peer does, and keeps the server's account
// of flow control: the window the server gives each stream it opens, and
// the connection-level window it grants and gives back (WINDOW_UPDATE on
// stream 0). What the rogue sent and the server did not give back is what
// the server holds of its request bodies.
type windowRogue struct {
	*h2conn
	streamWindow atomic.Int64 // the server's SETTINGS_INITIAL_WINDOW_SIZE
	connGranted  atomic.Int64 // 65535 and every connection WINDOW_UPDATE
	answered     sync.Map     // stream id -> its answer's HEADERS arrived
	ended        sync.Map     // stream id -> RST_STREAM or END_STREAM
	pings        chan [8]byte
}

func newWindowRogue(t *testing.T, addr string) *windowRogue {
	t.Helper()
	r := &windowRogue{pings: make(chan [8]byte, 16)}
	r.streamWindow.Store(65535)
	r.connGranted.Store(65535)
	r.h2conn = newH2Conn(t, addr, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(c *h2conn, f http2.Frame) {
		switch f := f.(type) {
		case *http2.PingFrame:
			if f.IsAck() {
				r.pings <- f.Data
				return
			}
			c.mu.Lock()
			_ = c.fr.WritePing(true, f.Data)
			c.mu.Unlock()
		case *http2.SettingsFrame:
			if f.IsAck() {
				return
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				r.streamWindow.Store(int64(v))
			}
			c.mu.Lock()
			_ = c.fr.WriteSettingsAck()
			c.mu.Unlock()
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				r.connGranted.Add(int64(f.Increment))
			}
		case *http2.HeadersFrame:
			r.answered.Store(f.StreamID, struct{}{})
			if f.StreamEnded() {
				r.ended.Store(f.StreamID, struct{}{})
			}
		case *http2.RSTStreamFrame:
			r.ended.Store(f.StreamID, struct{}{})
		case *http2.DataFrame:
			if f.StreamEnded() {
				r.ended.Store(f.StreamID, struct{}{})
			}
		}
	})
	return r
}

// sync sends a PING and waits for its answer: every frame the rogue sent
// before it has been read by the server, and what the server wrote in
// answer to them (its window updates) has been read by the rogue.
func (r *windowRogue) sync(t *testing.T, n byte) {
	t.Helper()
	data := [8]byte{'r', 'o', 'g', 'u', 'e', '3', '0', n}
	r.mu.Lock()
	err := r.fr.WritePing(false, data)
	r.mu.Unlock()
	if err != nil {
		t.Fatalf("ping: %v", err)
	}
	for {
		select {
		case got := <-r.pings:
			if got == data {
				return
			}
		case <-r.closed:
			t.Fatal("the server closed the connection")
		case <-time.After(closeWait): // a guard against a hang, not a timing
			t.Fatalf("no answer to a ping within %s", closeWait)
		}
	}
}

// openCall opens a stream calling procedure with the Authorization header
// auth ("" for none), its request not ended: its body is to follow.
func (r *windowRogue) openCall(t *testing.T, procedure, auth string) uint32 {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hbuf.Reset()
	fields := [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "tether"}, {":path", procedure}, {"content-type", "application/proto"}}
	if auth != "" {
		fields = append(fields, [2]string{"authorization", auth})
	}
	for _, kv := range fields {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	id := r.next
	r.next += 2
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRogue30EAConnectionCannotParkAMegabyteOfUnreadBody: a client sends a
// call the server refuses from its headers (no credential worth the name,
// or a dead agent's on a connection one of its calls had bound), grants no
// window for the refusal, and then sends the call's body, which nobody
// reads: it arrives after the refusal was decided, and waits in the
// server's buffer of the stream while the refusal waits to be written (up
// to the write timeout, 30 s), and the connection with it (its
// pre-authentication window, then that timeout again). Go's server let
// each stream, and each connection, send a megabyte it had not read: a
// megabyte a connection without a credential, 10 GB over the default cap
// of connections, each taking the place of the oldest; and as much again
// on each connection a rogue's lineage may hold. Measured from the wire:
// the bytes the server accepted and gave no window back for. A connection
// now has the server read at most controlplane.MaxReceiveBufferBytes
// ahead of its handlers, over all its streams.
func TestRogue30EAConnectionCannotParkAMegabyteOfUnreadBody(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		// Neither the connection's window to authenticate nor the
		// refusals' write deadlines may end what the rogue holds while
		// it is measured.
		cfg.Conn.PreAuthTimeout = time.Hour
		cfg.Conn.WriteTimeout = time.Hour
		cfg.Conn.ReadTimeout = time.Hour
	})
	admin := srv.AdminClients()
	addr := hostOf(t, srv.URL)
	for _, tc := range []struct {
		name string
		// auth is the refused calls' Authorization header; bind, when
		// set, binds the connection first with a call of the returned
		// credential's, which is dead afterwards.
		auth func(t *testing.T, r *windowRogue) string
	}{
		{"without a credential", func(*testing.T, *windowRogue) string { return "Bearer not-a-credential" }},
		{"a dead agent's calls on a connection it bound", func(t *testing.T, r *windowRogue) string {
			agent := register(t, admin, "rogue30e")
			id := r.openCall(t, tetherv1connect.AuthServiceWhoAmIProcedure, "Bearer "+agent.Credential)
			r.mu.Lock()
			err := r.fr.WriteData(id, true, nil)
			if err == nil {
				err = r.fr.WriteWindowUpdate(id, 1<<20)
			}
			r.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			testserver.WaitFor(t, closeWait, "the binding call's answer", func() bool { _, ok := r.ended.Load(id); return ok })
			terminateInStore(t, srv, agent.Node.NodeId)
			return "Bearer " + agent.Credential
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g0, h0 := serverLoad()
			r := newWindowRogue(t, addr)
			r.sync(t, 0) // the server's settings and first window read
			auth := tc.auth(t, r)
			// As many refused calls as the connection may hold unadmitted.
			var ids []uint32
			for range controlplane.PreAuthRequests {
				ids = append(ids, r.openCall(t, tetherv1connect.AgentServiceGetNodeProcedure, auth))
			}
			testserver.WaitFor(t, closeWait, "the refusals' headers", func() bool {
				for _, id := range ids {
					if _, ok := r.answered.Load(id); !ok {
						return false
					}
				}
				return true
			})
			// Their bodies, as much as the server's windows take.
			r.sync(t, 1)
			granted := r.connGranted.Load()
			var sent int64
			chunk := make([]byte, 16<<10)
			for _, id := range ids {
				left := r.streamWindow.Load()
				for left > 0 && sent < granted {
					n := min(int64(len(chunk)), left, granted-sent)
					r.mu.Lock()
					err := r.fr.WriteData(id, false, chunk[:n])
					r.mu.Unlock()
					if err != nil {
						t.Fatal(err)
					}
					left -= n
					sent += n
				}
			}
			r.sync(t, 2)
			held := sent - (r.connGranted.Load() - granted)
			ended := 0
			for _, id := range ids {
				if _, ok := r.ended.Load(id); ok {
					ended++
				}
			}
			g, h := serverLoad()
			t.Logf("%d refused calls: %d bytes of body sent, %d held by the server (%d streams ended); goroutines %d -> %d, heap %d KB -> %d KB",
				len(ids), sent, held, ended, g0, g, h0>>10, h>>10)
			if held > controlplane.MaxReceiveBufferBytes {
				t.Errorf("the server holds %d bytes of the refused calls' bodies on one connection, want at most %d", held, controlplane.MaxReceiveBufferBytes)
			}
		})
	}
}

// TestRogue30EAStreamCannotKeepLargeHeaders: a stream keeps its request's
// headers for as long as it lives — days, for a session or a feed — and
// Go's server keeps them decoded, a map entry a field. A rogue agent opened
// its streams each with headers near the server's limit on a request's
// headers (--max-header-bytes, 64 KiB): in 1,500 small fields (some 10 KB
// on the wire, never indexed) they held 139 KB of the server's heap per
// stream, beside the 15 KB of a plain one; over the streams a lineage may
// hold (its share, 5,000 by default, and four per node), a gigabyte and
// more. A stream whose request headers hold more than
// controlplane.MaxStreamHeaderBytes (counted as HTTP/2 does: each field's
// name and value and 32 bytes) or more than controlplane.MaxStreamHeaderFields
// fields is now refused resource_exhausted, holding nothing; a unary call
// still has --max-header-bytes, and ends within its timeouts.
func TestRogue30EAStreamCannotKeepLargeHeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue30e")
	c := srv.Clients(rogue.Credential)
	principal := "agent:" + rogue.Node.NodeId
	open := func(extra func(h interface{ Add(string, string) })) error {
		ctx, cancel := context.WithTimeout(context.Background(), closeWait) // a guard against a hang, not a timing
		defer cancel()
		req := connect.NewRequest(&tetherv1.WatchRevocationsRequest{})
		extra(req.Header())
		stream, err := c.Capability.WatchRevocations(ctx, req)
		if err != nil {
			return err
		}
		defer stream.Close()
		if !stream.Receive() {
			return stream.Err()
		}
		if n := srv.OpenStreams(principal); n != 1 {
			t.Errorf("the open stream is counted as %d streams of the rogue's", n)
		}
		return nil
	}
	// An honest stream, with a few headers of its own beside the
	// protocol's, is served.
	if err := open(func(h interface{ Add(string, string) }) {
		h.Add("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		h.Add("X-Request-Id", strings.Repeat("r", 64))
	}); err != nil {
		t.Fatalf("an honest stream: %v", err)
	}
	for _, tc := range []struct {
		name  string
		extra func(h interface{ Add(string, string) })
	}{
		{"many small fields", func(h interface{ Add(string, string) }) {
			for i := range 1500 {
				h.Add(fmt.Sprintf("X%d", i), "")
			}
		}},
		{"a few fields past the bytes", func(h interface{ Add(string, string) }) {
			for i := range 4 {
				h.Add(fmt.Sprintf("X-Pad-%d", i), strings.Repeat("p", 12<<10))
			}
		}},
		{"fields past the count", func(h interface{ Add(string, string) }) {
			for i := range controlplane.MaxStreamHeaderFields {
				h.Add(fmt.Sprintf("X%d", i), "")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := open(tc.extra)
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("a stream with such headers: %v, want resource_exhausted", err)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || !strings.Contains(ce.Message(), "headers") {
				t.Errorf("the refusal does not say what was refused: %v", err)
			}
			testserver.WaitFor(t, closeWait, "the refused stream's slot to be free", func() bool { return srv.OpenStreams(principal) == 0 })
		})
	}
}

// TestRogue30EARequestNotAdmittedHasItsBodyDiscarded: the bodies of
// requests that were not admitted — a call refused from its headers, a
// public answer such as GET /healthz that reads no body — stayed in the
// server's buffers, up to the connection's window, for as long as the
// answer waited to be written (up to the write timeout, 30 s) to a client
// granting no window: 64 KiB a connection (MaxReceiveBufferBytes), some
// 640 MB over the default cap of connections without a credential. Once
// such a request's answer is being written its body is discarded over
// HTTP/2 (the server gives back the window of each byte of it it gets),
// unless it is a public stream, which reads its messages as it answers.
func TestRogue30EARequestNotAdmittedHasItsBodyDiscarded(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.Conn.PreAuthTimeout = time.Hour
		cfg.Conn.WriteTimeout = time.Hour
		cfg.Conn.ReadTimeout = time.Hour
	})
	admin := srv.AdminClients()
	addr := hostOf(t, srv.URL)
	for _, tc := range []struct {
		name           string
		method, path   string
		auth           string
		bindWith, dead bool
	}{
		{"a call without a credential", "POST", tetherv1connect.AgentServiceGetNodeProcedure, "Bearer not-a-credential", false, false},
		{"a public answer", "GET", "/healthz", "", false, false},
		{"a dead agent's call on a connection it bound", "POST", tetherv1connect.AgentServiceGetNodeProcedure, "", true, true},
		{"a public answer on a bound connection", "GET", "/healthz", "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newWindowRogue(t, addr)
			r.sync(t, 0)
			auth := tc.auth
			if tc.bindWith {
				agent := register(t, admin, "rogue30e")
				id := r.openCall(t, tetherv1connect.AuthServiceWhoAmIProcedure, "Bearer "+agent.Credential)
				r.mu.Lock()
				err := r.fr.WriteData(id, true, nil)
				if err == nil {
					err = r.fr.WriteWindowUpdate(id, 1<<20)
				}
				r.mu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				testserver.WaitFor(t, closeWait, "the binding call's answer", func() bool { _, ok := r.ended.Load(id); return ok })
				if tc.dead {
					terminateInStore(t, srv, agent.Node.NodeId)
					auth = "Bearer " + agent.Credential
				}
			}
			r.mu.Lock()
			r.hbuf.Reset()
			fields := [][2]string{{":method", tc.method}, {":scheme", "http"}, {":authority", "tether"}, {":path", tc.path}, {"content-type", "application/proto"}}
			if auth != "" {
				fields = append(fields, [2]string{"authorization", auth})
			}
			for _, kv := range fields {
				_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			id := r.next
			r.next += 2
			err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true})
			r.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			testserver.WaitFor(t, closeWait, "the answer's headers", func() bool { _, ok := r.answered.Load(id); return ok })
			r.sync(t, 1)
			granted := r.connGranted.Load()
			sent := min(r.streamWindow.Load(), granted) / 2
			chunk := make([]byte, 16<<10)
			for left := sent; left > 0; {
				n := min(int64(len(chunk)), left)
				r.mu.Lock()
				err := r.fr.WriteData(id, false, chunk[:n])
				r.mu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				left -= n
			}
			r.sync(t, 2)
			held := sent - (r.connGranted.Load() - granted)
			_, ended := r.ended.Load(id)
			t.Logf("%d bytes of body sent after the answer began; %d held by the server (stream ended: %v)", sent, held, ended)
			if held > 0 {
				t.Errorf("the server holds %d bytes of the body of a request it does not read, while its answer waits", held)
			}
		})
	}
}
