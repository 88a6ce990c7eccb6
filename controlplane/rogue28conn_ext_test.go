package controlplane_test

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// openRaw opens a stream on r's connection with the header fields given
// (beside :scheme and :authority), its request ended when end is set. A
// header block past 16 KiB is sent as a HEADERS frame and CONTINUATIONs;
// a value past 1 KiB is kept out of the HPACK table.
func openRaw(r *stallRogue, end bool, fields ...[2]string) (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hbuf.Reset()
	for _, kv := range append([][2]string{{":scheme", "http"}, {":authority", "tether"}}, fields...) {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1], Sensitive: len(kv[1]) > 1024})
	}
	const frame = 16 << 10
	block := r.hbuf.Bytes()
	first := block[:min(frame, len(block))]
	rest := block[len(first):]
	id := r.next
	r.next += 2
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0, EndStream: end}); err != nil {
		return id, err
	}
	for len(rest) > 0 {
		chunk := rest[:min(frame, len(rest))]
		rest = rest[len(chunk):]
		if err := r.fr.WriteContinuation(id, len(rest) == 0, chunk); err != nil {
			return id, err
		}
	}
	return id, nil
}

// bindStalled makes a call with cred on r's connection and grants its
// answer (only it) a window, so that the connection is bound to cred's
// caller; it waits for the answer.
func bindStalled(t *testing.T, r *stallRogue, cred string) {
	t.Helper()
	id, err := openRaw(r, true, [2]string{":method", "POST"}, [2]string{":path", tetherv1connect.AuthServiceWhoAmIProcedure},
		[2]string{"content-type", "application/proto"}, [2]string{"authorization", "Bearer " + cred})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	err = r.fr.WriteWindowUpdate(id, 1<<20)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "the binding call's answer", func() bool { return r.isEnded(id) })
}

// TestRogue28ABoundConnectionCannotHoldManyUnreadAnswers: the bound on
// requests in flight that were not admitted (controlplane.PreAuthRequests)
// held only until a connection authenticated. A rogue agent makes one call
// with its credential on an HTTP/2 connection that grants no flow-control
// window (it lets that one answer through), which binds the connection to
// its lineage, and then fills the connection with requests whose answers
// it never takes: public answers (GET /healthz), console pages without a
// session, public streams waiting for a message, and calls with its own
// credential once its node is dead. Each held its goroutine and request
// until its write (or read) deadline, 30 s: 250 a connection, over its
// lineage's share of the connections (half the server's cap), and the dead
// one's connections stay counted until they close. Past the bound, such a
// request's stream is now reset (the connection, which may carry other
// callers' calls, is kept): at most PreAuthRequests of them wait on a
// connection, and a call admitted on it is still answered.
func TestRogue28ABoundConnectionCannotHoldManyUnreadAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		// Unbounded: the frame budget (rogue38b) would stop the flood of
		// public requests (which earn their connection no frames) before
		// what this test measures.
		cfg.Conn.ControlFrames = -1
	})
	admin := srv.AdminClients()
	addr := hostOf(t, srv.URL)
	const flood = 240
	for _, tc := range []struct {
		name string
		open func(r *stallRogue, cred string) (uint32, error)
		dead bool // the agent's node is dead before the flood
	}{
		{"public answers", func(r *stallRogue, _ string) (uint32, error) {
			return openRaw(r, true, [2]string{":method", "GET"}, [2]string{":path", "/healthz"})
		}, false},
		{"console pages without a session", func(r *stallRogue, _ string) (uint32, error) {
			return openRaw(r, true, [2]string{":method", "GET"}, [2]string{":path", "/ui/tree"})
		}, false},
		{"public streams", func(r *stallRogue, _ string) (uint32, error) {
			return openRaw(r, false, [2]string{":method", "POST"}, [2]string{":path", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"},
				[2]string{"content-type", "application/grpc"})
		}, false},
		{"a dead agent's refused calls", func(r *stallRogue, cred string) (uint32, error) {
			return openRaw(r, true, [2]string{":method", "POST"}, [2]string{":path", tetherv1connect.AgentServiceGetNodeProcedure},
				[2]string{"content-type", "application/json"}, [2]string{"authorization", "Bearer " + cred})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := register(t, admin, "rogue")
			g0, h0 := serverLoad()
			r := newStallRogue(t, addr)
			bindStalled(t, r, agent.Credential)
			if tc.dead {
				terminateInStore(t, srv, agent.Node.NodeId)
			}
			var ids []uint32
			for range flood {
				id, err := tc.open(r, agent.Credential)
				if err != nil {
					t.Fatalf("the connection failed after %d requests: %v", len(ids), err)
				}
				ids = append(ids, id)
			}
			ended := func() int {
				n := 0
				for _, id := range ids {
					if r.isEnded(id) {
						n++
					}
				}
				return n
			}
			testserver.WaitFor(t, closeWait, "all but PreAuthRequests of the unread requests to be ended", func() bool {
				return ended() >= flood-controlplane.PreAuthRequests
			})
			g, h := serverLoad()
			t.Logf("%d requests: %d ended; goroutines %d -> %d, heap %d KB -> %d KB", flood, ended(), g0, g, h0>>10, h>>10)
			if g > g0+2*controlplane.PreAuthRequests+16 {
				t.Errorf("the server holds %d more goroutines for the rogue's %d unread requests", g-g0, flood)
			}
			if r.isClosed() {
				t.Fatal("the bound connection was closed; only the unread requests were to end")
			}
			if tc.dead {
				return
			}
			// A call admitted on the connection is still answered.
			bindStalled(t, r, agent.Credential)
		})
	}
}

// TestRogue28AFrameHeaderCannotMakeTheServerHoldAMegabyte: a client with
// no credential opens connections and sends on each, after the preface
// and its settings, the 9-byte header of one frame declaring a megabyte
// of payload, and nothing more. The server advertised (and would read)
// frames of up to a megabyte, and its framer allocates a frame's whole
// payload when it reads the frame's header, keeping that buffer for the
// connection's life: nine bytes bought a megabyte of the server's memory
// for as long as the connection was kept (64 connections: 64 MB), over
// every connection the server takes (10,000 by default: 10 GB). The
// server now advertises, and reads, frames of at most
// controlplane.MaxFrameBytes: a larger frame is a protocol error that
// closes the connection at once.
func TestRogue28AFrameHeaderCannotMakeTheServerHoldAMegabyte(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		// Only the frame may close the connections.
		cfg.Conn.PreAuthTimeout = time.Hour
	})
	addr := hostOf(t, srv.URL)
	g0, h0 := serverLoad()
	const conns = 64
	var rogues []*h2conn
	var advertised atomic.Uint32
	for range conns {
		r := newH2Conn(t, addr, nil, func(c *h2conn, f http2.Frame) {
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				if v, ok := s.Value(http2.SettingMaxFrameSize); ok {
					advertised.Store(v)
				}
			}
		})
		var hdr [9]byte
		hdr[0], hdr[1], hdr[2] = 0x10, 0, 0 // a length of 1 MiB
		hdr[3] = 0xfa                       // a frame type the server ignores
		r.mu.Lock()
		_, err := r.c.Write(hdr[:])
		r.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		rogues = append(rogues, r)
	}
	testserver.WaitFor(t, closeWait, "the server to take the rogue's connections", func() bool { return srv.OpenConnections() >= 1 })
	g, h := serverLoad()
	t.Logf("%d connections each declaring a 1 MiB frame: goroutines %d -> %d, heap %d KB -> %d KB; max frame size advertised %d", conns, g0, g, h0>>10, h>>10, advertised.Load())
	for i, r := range rogues {
		select {
		case <-r.closed:
		case <-time.After(closeWait): // a guard against a hang, not a timing
			t.Fatalf("connection %d: the server kept for %s a connection that declared a frame of 1 MiB", i, closeWait)
		}
	}
	if v := advertised.Load(); v == 0 || v > controlplane.MaxFrameBytes {
		t.Fatalf("the server advertised frames of %d bytes, want at most %d", v, controlplane.MaxFrameBytes)
	}
}

// TestRogue28ABoundConnectionWithoutAdmittedWorkIdlesOut: a connection
// bound to a caller idled out only when it carried no request at all, so
// a rogue whose node is dead (or any caller) kept it for ever with
// requests that are never admitted — a refused call whose answer it does
// not take, a GET /healthz now and then — counted against its lineage's
// share, and against the connections agents may hold together, where no
// newcomer can take its place. A bound connection that carries no
// admitted request for the idle timeout is now closed, whatever else it
// carries; one with an admitted stream open is kept
// (TestActiveStreamsOutliveTheTimeouts).
func TestRogue28ABoundConnectionWithoutAdmittedWorkIdlesOut(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.Conn.IdleTimeout = closeWait / 20
	})
	admin := srv.AdminClients()
	addr := hostOf(t, srv.URL)
	for _, tc := range []struct {
		name string
		dead bool
		open func(r *stallRogue, cred string) (uint32, error)
	}{
		{"a dead agent's refused call", true, func(r *stallRogue, cred string) (uint32, error) {
			return openRaw(r, true, [2]string{":method", "POST"}, [2]string{":path", tetherv1connect.AgentServiceGetNodeProcedure},
				[2]string{"content-type", "application/json"}, [2]string{"authorization", "Bearer " + cred})
		}},
		{"a live agent's public request", false, func(r *stallRogue, _ string) (uint32, error) {
			return openRaw(r, true, [2]string{":method", "GET"}, [2]string{":path", "/healthz"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := register(t, admin, "rogue")
			before := srv.OpenConnections()
			r := newStallRogue(t, addr)
			bindStalled(t, r, agent.Credential)
			if tc.dead {
				terminateInStore(t, srv, agent.Node.NodeId)
			}
			// Its answer is never taken: the stream stays open until its
			// write deadline (30 s), the connection busy meanwhile.
			if _, err := tc.open(r, agent.Credential); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.closed:
			case <-time.After(closeWait): // a guard against a hang, not a timing
				t.Fatalf("the server kept for %s a bound connection carrying no admitted request (idle timeout %s)", closeWait, closeWait/20)
			}
			testserver.WaitFor(t, closeWait, "the connection's place to be given back", func() bool { return srv.OpenConnections() <= before })
		})
	}
}
