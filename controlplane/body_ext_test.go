package controlplane_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// gzipBomb returns members gzip members each inflating to 1 MiB of zeros,
// concatenated (a gzip reader reads them as one stream): about 1 KiB of
// gzip per MiB inflated.
func gzipBomb(t *testing.T, members int) []byte {
	t.Helper()
	var one bytes.Buffer
	zw, err := gzip.NewWriterLevel(&one, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(one.Bytes(), members)
}

// countingBody counts the request body bytes the handlers read.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// serveCounting serves the server's own handler on a second loopback
// listener (HTTP/1.1 and HTTP/2 cleartext), counting the body bytes it
// reads.
func serveCounting(t *testing.T, srv *testserver.Server) (url string, read *atomic.Int64) {
	t.Helper()
	read = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Protocols: p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = countingBody{ReadCloser: r.Body, n: read}
		srv.Handler().ServeHTTP(w, r)
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String(), read
}

// TestGzipBombWithoutCredentialIsNeverRead: a 1 MB gzip body that inflates
// to 1 GiB, sent without a token, is refused as unauthenticated from its
// headers: not one byte of it is read, let alone inflated.
func TestGzipBombWithoutCredentialIsNeverRead(t *testing.T) {
	srv := testserver.Start(t)
	url, read := serveCounting(t, srv)
	bomb := gzipBomb(t, 1024) // 1 GiB inflated
	if len(bomb) > 2<<20 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	for _, token := range []string{"", "not-a-token", srv.Admin + "x"} {
		req, err := http.NewRequest(http.MethodPost, url+"/tether.v1.AgentService/RegisterRoot", bytes.NewReader(bomb))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/proto")
		req.Header.Set("Content-Encoding", "gzip")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		before := read.Load()
		resp, err := testserver.H2CClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "unauthenticated") {
			t.Fatalf("token %q: %s %s, want 401 unauthenticated", token, resp.Status, body)
		}
		if n := read.Load() - before; n != 0 {
			t.Fatalf("token %q: the server read %d bytes of the body of an unauthenticated request", token, n)
		}
	}
	assertNodeCount(t, srv.AdminClients(), 0)
}

// TestCompressedBodyIsBoundedByTheSameLimit: an authenticated caller's
// gzip body that inflates past the message limit is refused once the limit
// is passed. Connect's stock gzip would inflate the whole body to report
// its size ("message size N is larger…"); the server's decompressor stops
// one byte past the limit.
func TestCompressedBodyIsBoundedByTheSameLimit(t *testing.T) {
	const limit = 64 << 10
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.MaxRequestBytes = limit })
	bomb := gzipBomb(t, 32) // ~32 KiB of gzip, under the limit; 32 MiB inflated
	if len(bomb) >= limit {
		t.Fatalf("the bomb is %d bytes, not under the %d limit", len(bomb), limit)
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/tether.v1.AgentService/RegisterRoot", bytes.NewReader(bomb))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Authorization", "Bearer "+srv.Admin)
	resp, err := srv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	msg := string(body)
	if !strings.Contains(msg, "resource_exhausted") || !strings.Contains(msg, "65536") {
		t.Fatalf("%s %s, want resource_exhausted naming the limit", resp.Status, msg)
	}
	if strings.Contains(msg, "message size 33554432") || !strings.Contains(msg, "larger than the limit; not inflating the rest") {
		t.Fatalf("the server inflated the whole body to measure it: %s", msg)
	}
	// The same through a Connect client with gzip, on a stream message too.
	gz := testserver.NewClients(srv.HTTP, srv.URL, srv.Admin, connect.WithSendGzip())
	_, err = gz.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bomb", Labels: map[string]string{"k": strings.Repeat("x", 2*limit)}}))
	wantLimit(t, "a gzip request inflating past the limit", err, connect.CodeResourceExhausted, "65536")
	assertNodeCount(t, srv.AdminClients(), 0)
}

// TestOversizedBodiesAreNotReadToTheEnd: an authenticated caller's body
// past the message limit costs the server at most the limit to refuse —
// a long unary body, and an enveloped message (gRPC, Connect streams) whose
// prefix declares 1 GiB — where Connect alone would read on to the end to
// report the size.
func TestOversizedBodiesAreNotReadToTheEnd(t *testing.T) {
	const limit = 64 << 10
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.MaxRequestBytes = limit })
	url, read := serveCounting(t, srv)
	send := func(what, path, contentType string, body []byte, extra http.Header) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+srv.Admin)
		for k, v := range extra {
			req.Header[k] = v
		}
		before := read.Load()
		resp, err := testserver.H2CClient().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := read.Load() - before; n > 2*limit {
			t.Fatalf("%s: the server read %d bytes of a body past the %d limit", what, n, limit)
		}
		return resp, string(b)
	}
	// Connect unary: 8 MiB of JSON.
	resp, body := send("a long unary body", "/tether.v1.AgentService/RegisterRoot", "application/json",
		append([]byte(`{"name":"`), bytes.Repeat([]byte("x"), 8<<20)...), nil)
	if !strings.Contains(body, "resource_exhausted") || !strings.Contains(body, "65536") {
		t.Fatalf("a long unary body: %s %s", resp.Status, body)
	}
	// gRPC: one envelope declaring 1 GiB, followed by 4 MiB.
	envelope := append([]byte{0, 0x40, 0, 0, 0}, make([]byte, 4<<20)...)
	resp, _ = send("a 1 GiB envelope", "/tether.v1.AuthService/WhoAmI", "application/grpc", envelope, http.Header{"Te": {"trailers"}})
	if got := resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status"); got != "8" {
		t.Fatalf("a 1 GiB envelope: grpc-status %q (%s), want 8 (resource_exhausted)", got, resp.Trailer.Get("Grpc-Message")+resp.Header.Get("Grpc-Message"))
	}
	assertNodeCount(t, srv.AdminClients(), 0)
}
