package controlplane_test

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
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
	call := func(cred string) [][2]string {
		return [][2]string{{":method", "POST"}, {":path", tetherv1connect.AuthServiceWhoAmIProcedure},
			{"content-type", "application/proto"}, {"authorization", "Bearer " + cred}}
	}
	for _, tc := range []struct {
		name    string
		request [][2]string
		calls   int
		status  string
	}{
		{"valid", call(srv.Admin), 100, "200"},
		{"dead", call("not-a-credential"), controlplane.PreAuthRequests, "401"},
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
			if err := fr.WriteWindowUpdate(0, 1<<30); err != nil {
				t.Fatal(err)
			}
			var hbuf bytes.Buffer
			enc := hpack.NewEncoder(&hbuf)
			for i := range tc.calls {
				hbuf.Reset()
				for _, kv := range append([][2]string{{":scheme", "http"}, {":authority", "tether"}}, tc.request...) {
					_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
				}
				// No body (an empty message), in the request's one frame.
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
					t.Fatal(err)
				}
			}
			status := map[uint32]string{}
			ended := map[uint32]bool{}
			for len(ended) < tc.calls {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("the connection ended after %d of %d answers: %v", len(ended), tc.calls, err)
				}
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

// TestRogue27AConsolePagePastTheBoundIsServed: a browser's console page is
// public to the auth Gate (the console checks the session's cookie, and
// its calls to the API bind the connection), so it is not closed at once
// past controlplane.PreAuthRequests as a public endpoint's request is:
// with eight requests of the fresh connection still unanswered (they wait
// for a flow-control window the browser has not granted yet), a console
// page asked with the operator's session is answered, and so are the
// eight once the window comes.
func TestRogue27AConsolePagePastTheBoundIsServed(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 100 })
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	signin, err := browser.PostForm(srv.URL+"/ui/signin", url.Values{"token": {srv.Admin}})
	if err != nil {
		t.Fatal(err)
	}
	signin.Body.Close()
	var cookie string
	for _, c := range signin.Cookies() {
		if c.Name == "tether_console" {
			cookie = c.Name + "=" + c.Value
		}
	}
	if cookie == "" {
		t.Fatalf("the sign-in answered %s with no session cookie", signin.Status)
	}
	c := dial(t, hostOf(t, srv.URL))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	request := func(id uint32, path string, header ...[2]string) {
		t.Helper()
		hbuf.Reset()
		for _, kv := range append([][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "tether"}, {":path", path}}, header...) {
			_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
	}
	const page = 2*controlplane.PreAuthRequests + 1
	for i := range controlplane.PreAuthRequests {
		request(uint32(2*i+1), "/healthz")
	}
	// Each stream's headers are written without window: the page's say it
	// was let in.
	status := map[uint32]string{}
	read := func(until func() bool) {
		t.Helper()
		for !until() {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("the connection ended (%d answers begun): %v", len(status), err)
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if s := f.PseudoValue("status"); s != "" {
					status[f.StreamID] = s
				}
			case *http2.RSTStreamFrame:
				t.Fatalf("stream %d reset (%v)", f.StreamID, f.ErrCode)
			case *http2.GoAwayFrame:
				t.Fatalf("GOAWAY (%v)", f.ErrCode)
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = fr.WritePing(true, f.Data)
				}
			}
		}
	}
	read(func() bool { return len(status) == controlplane.PreAuthRequests })
	request(page, "/ui/tree", [2]string{"cookie", cookie})
	read(func() bool { return status[page] != "" })
	if status[page] != "200" {
		t.Fatalf("the console page answered %s", status[page])
	}
	// The window: every answer is written whole.
	ended := map[uint32]bool{}
	for id := uint32(1); id <= page; id += 2 {
		if err := fr.WriteWindowUpdate(id, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	for len(ended) < controlplane.PreAuthRequests+1 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended after %d answers: %v", len(ended), err)
		}
		if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
			ended[d.StreamID] = true
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() {
			ended[h.StreamID] = true
		}
	}
}
