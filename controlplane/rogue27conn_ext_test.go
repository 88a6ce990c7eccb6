package controlplane_test

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestRogue27AnUnauthenticatedConnectionCannotHoldManyUnreadAnswers: a
// client with no credential opens one HTTP/2 connection that grants the
// server no flow-control window and sends a full connection's worth of
// requests (250 streams: refused RPCs and public GETs), answering the
// server's pings and reading none of the answers' bodies. Each answer
// waited for window in its handler until its write deadline (30 s), and
// the connection lived on until its pre-authentication window and the
// grace after it (40 s): some 250 goroutines and 2.5 MB of the server's
// memory per connection, without a credential, over as many connections
// as the server takes (20 connections held 5,000 goroutines and 50 MB).
// An unauthenticated connection now has at most
// controlplane.PreAuthRequests requests in flight that do not
// authenticate: the answer of one past them closes the connection, and
// everything on it is freed at once. The operator's connection is served
// throughout.
func TestRogue27AnUnauthenticatedConnectionCannotHoldManyUnreadAnswers(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	op := newOwnConn(t, srv, srv.Admin)
	if err := whoAmI(op.Clients); err != nil {
		t.Fatal(err)
	}
	// Each opens a stream on the rogue's connection (r.mu held).
	get := func(r *stallRogue, method, path, contentType string, end bool) error {
		r.hbuf.Reset()
		fields := [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "tether"}, {":path", path}}
		if contentType != "" {
			fields = append(fields, [2]string{"content-type", contentType})
		}
		for _, kv := range fields {
			_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.next, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: end})
		r.next += 2
		return err
	}
	for _, tc := range []struct {
		name string
		open func(r *stallRogue) error
	}{
		{"refused calls", func(r *stallRogue) error {
			_, err := r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/json", "not-a-credential", true)
			return err
		}},
		{"public answers", func(r *stallRogue) error { return get(r, "GET", "/healthz", "", true) }},
		// A public stream waiting for a message that never comes writes
		// nothing: it was held until its read deadline.
		{"public streams", func(r *stallRogue) error {
			return get(r, "POST", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "application/grpc", false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStallRogue(t, hostOf(t, srv.URL))
			r.mu.Lock()
			for range 250 {
				if err := tc.open(r); err != nil {
					break // the server closed the connection meanwhile
				}
			}
			r.mu.Unlock()
			select {
			case <-r.closed:
			case <-time.After(closeWait): // a guard against a hang, not a timing
				t.Fatalf("the server kept for %s an unauthenticated connection holding 250 requests it could not answer", closeWait)
			}
			testserver.WaitFor(t, closeWait, "only the operator's connection to be left", func() bool { return srv.OpenConnections() == 1 })
			if err := whoAmI(op.Clients); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRogue27AnHonestBurstOnAFreshConnectionIsServed: the bound on an
// unauthenticated connection's requests does not touch a client that
// authenticates: a fresh connection's first frames are a burst of 100
// calls with a valid credential, all in flight before any is admitted,
// and every one is answered on that connection; so are a few calls with a
// dead credential (each told unauthenticated, the connection kept).
func TestRogue27AnHonestBurstOnAFreshConnectionIsServed(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.RateBurst, cfg.AnonymousRateLimit = 1000, 100 })
	for _, tc := range []struct {
		name   string
		cred   string
		calls  int
		status string
	}{
		{"valid", srv.Admin, 100, "200"},
		{"dead", "not-a-credential", controlplane.PreAuthRequests, "401"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, hostOf(t, srv.URL))
			if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(c, c)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			var hbuf bytes.Buffer
			enc := hpack.NewEncoder(&hbuf)
			for i := range tc.calls {
				hbuf.Reset()
				for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "tether"}, {":path", tetherv1connect.AuthServiceWhoAmIProcedure},
					{"content-type", "application/proto"}, {"authorization", "Bearer " + tc.cred}} {
					_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
				}
				// An empty message, in the request's one frame.
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			status := map[uint32]string{}
			ended := map[uint32]bool{}
			for len(ended) < tc.calls {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("the connection ended after %d of %d answers: %v", len(ended), tc.calls, err)
				}
				mu.Lock()
				switch f := f.(type) {
				case *http2.MetaHeadersFrame:
					if s := f.PseudoValue("status"); s != "" {
						status[f.StreamID] = s
					}
					if f.StreamEnded() {
						ended[f.StreamID] = true
					}
				case *http2.DataFrame:
					if f.StreamEnded() {
						ended[f.StreamID] = true
					}
				case *http2.RSTStreamFrame:
					t.Fatalf("stream %d reset (%v)", f.StreamID, f.ErrCode)
				case *http2.GoAwayFrame:
					t.Fatalf("GOAWAY after %d answers (%v)", len(ended), f.ErrCode)
				case *http2.SettingsFrame:
					if !f.IsAck() {
						_ = fr.WriteSettingsAck()
					}
				case *http2.PingFrame:
					if !f.IsAck() {
						_ = fr.WritePing(true, f.Data)
					}
				}
				mu.Unlock()
			}
			for id, s := range status {
				if s != tc.status {
					t.Fatalf("stream %d answered %s, want %s", id, s, tc.status)
				}
			}
			if len(status) != tc.calls {
				t.Fatalf("%d statuses for %d calls", len(status), tc.calls)
			}
		})
	}
}
