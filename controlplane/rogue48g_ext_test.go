package controlplane_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
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

// TestRogue48GHealthWatchIsNotAFreeStream: gRPC health's Watch, served
// without a credential on the API's port beside Check, was a server
// stream that charged no budget: its handler registered a watcher with
// the health checker (one more entry in a list every watch's end walks
// under the lock every health check takes), sent SERVING and then waited,
// its goroutines and HTTP/2 stream held, for a change that never comes
// (the control plane never changes a service's health status) until the
// stream's write timeout. A client without a credential held eight on
// each connection it may open, and churned them, each end a walk of every
// other watcher, as fast as its frames allowed. Watch is now answered
// unimplemented at once, which gRPC's health-checking clients read as "no
// health watching: the server is healthy"; Check answers as before.
func TestRogue48GHealthWatchIsNotAFreeStream(t *testing.T) {
	srv := testserver.Start(t)
	client := testserver.H2CClient()
	const streams = 8 // controlplane.PreAuthRequests: what one connection may hold
	before := runtime.NumGoroutine()
	var bodies []io.ReadCloser
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
	}()
	held := 0
	for i := range streams {
		// An empty HealthCheckRequest (the whole server) in a Connect
		// streaming envelope.
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/grpc.health.v1.Health/Watch", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/connect+proto") // no credential
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("watch %d: %s", i, resp.Status)
		}
		var head [5]byte
		if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
			t.Fatalf("watch %d: reading its first envelope: %v", i, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatalf("watch %d: reading its first envelope: %v", i, err)
		}
		if head[0]&2 == 0 {
			// A status message: the stream goes on, held open.
			held++
			continue
		}
		if !strings.Contains(string(msg), `"unimplemented"`) {
			t.Fatalf("watch %d ended with %s, want unimplemented", i, msg)
		}
		if rest, _ := io.ReadAll(resp.Body); len(rest) != 0 {
			t.Fatalf("watch %d: %d bytes after its end", i, len(rest))
		}
	}
	if held > 0 {
		t.Fatalf("%d of %d gRPC health Watch streams without a credential were answered SERVING and held open (%d goroutines more than before them), each a watcher the checker keeps until the stream's write timeout; want each answered unimplemented at once",
			held, streams, runtime.NumGoroutine()-before)
	}
	// Check, the probe orchestrators use, answers as before.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/grpc.health.v1.Health/Check", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/proto")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, []byte{8, 1}) {
		t.Fatalf("health Check: %s %x, want 200 and SERVING (08 01)", resp.Status, body)
	}
}

// TestRogue48GConsolePagesWithoutASessionAreThrottledAsFrames: a client
// without a credential asks for console pages — the sign-in page, the
// redirect to it, a static file — on one HTTP/2 connection, back to back.
// No budget is charged for a page without a session, and each page earned
// its connection FramesPerRequest frames, as a call the auth Gate judges
// does, for the one or two it costs: the connection was never slowed, and
// the server answered as fast as the client asked (on tether serve, one
// connection of eight requests in flight: 21,482 sign-in pages in 4 s,
// 55% of a core; /healthz, which earns nothing, 141). A page now earns
// nothing itself (the console's calls to the API for a signed-in
// browser's page earn, judged as calls): with the clock stopped, the
// client's connection is read no further once its frame budget is spent,
// and another agent's calls go on.
func TestRogue48GConsolePagesWithoutASessionAreThrottledAsFrames(t *testing.T) {
	floodWithoutACredential(t, []rogue48gFlood{
		{http.MethodGet, "/ui/", 1000, false}, // the redirect to the sign-in page
		{http.MethodHead, "/ui/static/console.js", 1000, false},
		{http.MethodGet, "/ui/signin", 4000, true},
	})
}

// TestRogue48GRefusalsBeforeAuthenticationAreThrottledAsFrames: a client
// without a credential calls the API on one HTTP/2 connection, back to
// back: each call is refused unauthenticated, charged to its address's
// budget of requests without a valid credential, and once that is spent
// refused free (resource_exhausted). Each refusal earned the connection
// FramesPerRequest frames, as a call the auth Gate judges does, for the
// one it costs, so the connection was never slowed: on tether serve, one
// connection keeping eight calls in flight had 17,009 refused in 3 s, 58%
// of a core. A refusal on a connection no call has bound (none admitted
// on it) now earns nothing — no honest caller's work rides on it; a
// follower's connection, carrying its callers' refused calls, is bound
// by their admitted ones and earns as before — so the connection is
// throttled as its frame budget is spent.
func TestRogue48GRefusalsBeforeAuthenticationAreThrottledAsFrames(t *testing.T) {
	floodWithoutACredential(t, []rogue48gFlood{
		{http.MethodGet, tetherv1connect.AuthServiceWhoAmIProcedure, 1000, false},
		{http.MethodPost, "/tether.v1.NoSuchService/Call", 1000, false},
	})
}

// rogue48gFlood is a request a client without a credential sends flood
// times on one connection.
type rogue48gFlood struct {
	method, path string
	flood        int
	// large: each answer a DATA frame of a KiB or more, which earns the
	// connection a frame once written (the window update it calls for),
	// so that a client giving its window back in large steps pays about a
	// fifteenth of a frame a page: throttled later, after some 1,900
	// pages, then 30 a second.
	large bool
}

// floodWithoutACredential sends each case's requests on a connection of
// its own, with the clock stopped, and wants the connection throttled
// (not closed) once its frame budget is spent, another agent's calls
// served meanwhile.
func floodWithoutACredential(t *testing.T, cases []rogue48gFlood) {
	limits := controlplane.DefaultConnLimits
	for _, tc := range cases {
		flood := tc.flood
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
				cfg.Conn.PreAuthTimeout = time.Hour // the flood is not cut short by the real clock
			})
			other := srv.Clients(register(t, srv.AdminClients(), "other").Credential)
			before := srv.ThrottledConnections()
			var answered, dataBytes atomic.Int64
			// room: a place for one more page in flight, given back by each
			// answer. The client keeps half of controlplane.PreAuthRequests
			// in flight: a connection without a credential with more is
			// closed, and the server counts a request until its handler
			// has returned, which may be after its answer arrived.
			room := make(chan struct{}, flood+controlplane.PreAuthRequests)
			for range controlplane.PreAuthRequests / 2 {
				room <- struct{}{}
			}
			ended := func() {
				answered.Add(1)
				room <- struct{}{}
			}
			r := newH2ConnOn(t, dial(t, hostOf(t, srv.URL)), nil, func(h *h2conn, f http2.Frame) {
				switch f := f.(type) {
				case *http2.RSTStreamFrame:
					ended()
				case *http2.HeadersFrame:
					if f.StreamEnded() {
						ended()
					}
				case *http2.DataFrame:
					// The connection's window given back every 16 KiB,
					// in one frame (each page's stream has a window of
					// its own).
					if n := dataBytes.Add(int64(len(f.Data()))); n/(16<<10) != (n-int64(len(f.Data())))/(16<<10) {
						h.mu.Lock()
						_ = h.fr.WriteWindowUpdate(0, 16<<10)
						h.mu.Unlock()
					}
					if f.StreamEnded() {
						ended()
					}
				}
			})
			done := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for range flood {
					select {
					case <-room:
					case <-done:
						return
					}
					r.mu.Lock()
					r.hbuf.Reset()
					for _, kv := range [][2]string{{":method", tc.method}, {":scheme", "http"}, {":authority", "tether"}, {":path", tc.path}} {
						_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
					}
					id := r.next
					r.next += 2
					err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: true})
					r.mu.Unlock()
					if err != nil {
						return // closed
					}
				}
			})
			testserver.WaitFor(t, closeWait, "the connection to be throttled, or every request answered", func() bool {
				return srv.ThrottledConnections() > before || answered.Load() >= int64(flood)
			})
			// What the connection may read with the clock stopped: its
			// budget, the server's SETTINGS and PINGs, the frame that spent
			// it, and what the pages' answers earned by their bytes (a
			// KiB or more a DATA frame earns one: at most one a page).
			bound := int64(limits.ControlFrames+8) + dataBytes.Load()/controlplane.EarnedDataBytes
			if tc.large {
				bound = int64(flood) - 1
			}
			if r.isClosed() {
				t.Fatalf("the server closed the connection after %d answers; want it slowed", answered.Load())
			}
			if n := answered.Load(); srv.ThrottledConnections() == before || n > bound {
				t.Fatalf("%d of %d requests without a credential answered on one connection with the clock stopped (%d connections throttled); want the connection throttled after at most %d",
					n, flood, srv.ThrottledConnections()-before, bound)
			}
			t.Logf("%d of %d answered before the connection was throttled (bound %d)", answered.Load(), flood, bound)
			for range 10 {
				if err := whoAmI(other); err != nil {
					t.Fatalf("another agent's call while the flooding connection is throttled: %v", err)
				}
			}
			close(done)
			_ = r.c.Close()
			wg.Wait()
			clk.Advance(controlplane.MaxThrottled + time.Second)
			testserver.WaitFor(t, closeWait, "the closed connection to leave the throttled count", func() bool {
				return srv.ThrottledConnections() == before
			})
		})
	}
}
