package controlplane_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// TestRogue45GPublicEndpointsDoNotGzipSmallAnswers: the endpoints served
// without a credential on the API's port (gRPC health's Check, server
// reflection's stream) gzipped every answer, however small, for any client
// that said it accepts gzip: Connect compresses an answer of any size
// unless told a minimum, and only the API's services were told one
// (compressMinBytes). Each compression resets a flate compressor, some
// 600 KiB of tables cleared, for an answer of two bytes: the health check,
// which charges no budget, cost the server several times its own work,
// free, as often as anyone who can reach the port asks for it. The public
// endpoints now compress as the API does, only answers of compressMinBytes
// or more.
func TestRogue45GPublicEndpointsDoNotGzipSmallAnswers(t *testing.T) {
	srv := testserver.Start(t)
	// A reflection request listing the services: field 7 (list_services),
	// an empty string. Its answer names a dozen services, well under
	// compressMinBytes.
	list := []byte{7<<3 | 2, 0}
	envelope := func(msg []byte) []byte {
		return append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	}
	for _, tc := range []struct {
		name, path string
		body       []byte
		header     http.Header
		// compressed says whether the answer came back gzipped.
		compressed func(resp *http.Response, body []byte) bool
	}{
		{"gRPC health Check (Connect unary)", "/grpc.health.v1.Health/Check", nil,
			http.Header{"Content-Type": {"application/proto"}, "Accept-Encoding": {"gzip"}},
			func(resp *http.Response, _ []byte) bool { return resp.Header.Get("Content-Encoding") == "gzip" }},
		{"gRPC health Check (gRPC)", "/grpc.health.v1.Health/Check", envelope(nil),
			http.Header{"Content-Type": {"application/grpc+proto"}, "Grpc-Accept-Encoding": {"gzip"}, "Te": {"trailers"}},
			func(_ *http.Response, body []byte) bool { return len(body) > 0 && body[0]&1 != 0 }},
		{"server reflection stream (Connect)", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", envelope(list),
			http.Header{"Content-Type": {"application/connect+proto"}, "Connect-Accept-Encoding": {"gzip"}},
			func(_ *http.Response, body []byte) bool { return len(body) > 0 && body[0]&1 != 0 }},
		{"server reflection stream (gRPC)", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", envelope(list),
			http.Header{"Content-Type": {"application/grpc+proto"}, "Grpc-Accept-Encoding": {"gzip"}, "Te": {"trailers"}},
			func(_ *http.Response, body []byte) bool { return len(body) > 0 && body[0]&1 != 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tc.header // no credential
			resp, err := testserver.H2CClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				t.Fatalf("%s: %q, want an answer", resp.Status, body)
			}
			if tc.compressed(resp, body) {
				t.Fatalf("an answer of %d bytes was gzipped for a client without a credential (a flate compressor's reset each)", len(body))
			}
		})
	}
}

// TestRogue45GBAPeersFramesDoNotWriteTheServersWarnings: net/http's HTTP/2
// server writes a line to its error log for what a peer does to it — each
// GOAWAY it sends with an error code, a protocol error that ends its
// connection — and the control plane logged every such line as a warning.
// Without a credential, a client had the server write a warning for each
// GOAWAY frame of 17 bytes it sent, a hundred and more on each connection
// it opens (its frame budget's burst) before the connection closes: an
// attacker's bandwidth turned into the operator's warnings about byte for
// byte or more (on `tether serve`, 200 connections sending 442 KB of them
// had it write 357 KB and 691 KB of warnings in two runs; none now). What a peer did to its own connection is now logged at
// debug level, as the observer logs a refusal; what the server did wrong
// (a panic, an answer written twice) is still a warning.
func TestRogue45GBAPeersFramesDoNotWriteTheServersWarnings(t *testing.T) {
	var logged lockedBuffer
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	addr := strings.TrimPrefix(srv.URL, "http://")
	h2frame := func(typ, flags byte, stream uint32, payload []byte) []byte {
		f := make([]byte, 9, 9+len(payload))
		f[0], f[1], f[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		f[3], f[4] = typ, flags
		binary.BigEndian.PutUint32(f[5:], stream)
		return append(f, payload...)
	}
	goaway := make([]byte, 8)
	binary.BigEndian.PutUint32(goaway[4:], 2) // INTERNAL_ERROR
	for _, tc := range []struct {
		name   string
		frames [][]byte
	}{
		{"GOAWAY frames with an error code", [][]byte{
			h2frame(7, 0, 0, goaway), h2frame(7, 0, 0, goaway), h2frame(7, 0, 0, goaway), h2frame(7, 0, 0, goaway),
		}},
		// A DATA frame on stream 0: a connection error.
		{"a protocol error", [][]byte{h2frame(0, 0, 0, []byte("x"))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := logged.String()
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			out := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), h2frame(4, 0, 0, nil)...)
			for _, f := range tc.frames {
				out = append(out, f...)
			}
			if _, err := nc.Write(out); err != nil {
				t.Fatal(err)
			}
			// The server closes the connection once it has read them (a
			// graceful shutdown, or its own GOAWAY): what it logs for
			// them is written by then.
			if _, err := io.Copy(io.Discard, nc); err != nil {
				t.Fatal(err)
			}
			lines := strings.Count(strings.TrimPrefix(logged.String(), before), "level=WARN")
			if lines > 0 {
				t.Fatalf("a client without a credential had the server write %d warnings for its own frames:\n%s", lines, strings.TrimPrefix(logged.String(), before))
			}
		})
	}
	// Over TLS, a connection that fails its handshake (here bytes that
	// are not a TLS record) was a warning each.
	t.Run("a failed TLS handshake", func(t *testing.T) {
		var logged lockedBuffer
		files := testserver.NewTLSFiles(t)
		srv := testserver.Start(t, func(cfg *controlplane.Config) {
			cfg.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
			cfg.TLSCert, cfg.TLSKey = files.ServerCert, files.ServerKey
		})
		before := logged.String()
		nc, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write([]byte("\x00\x01\x02\x03\x04\x05\x06\x07")); err != nil {
			t.Fatal(err)
		}
		// The server closes the connection once the handshake failed,
		// after logging it.
		_, _ = io.Copy(io.Discard, nc)
		if lines := strings.Count(strings.TrimPrefix(logged.String(), before), "level=WARN"); lines > 0 {
			t.Fatalf("a client without a credential had the server write %d warnings for its failed handshake:\n%s", lines, strings.TrimPrefix(logged.String(), before))
		}
	})
}

// lockedBuffer is a bytes.Buffer written from the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRogue45GCATruncatedMessageIsNotLoggedAsTheServersError: a stream's
// message cut short by its sender (an envelope promising more bytes than
// its body holds, then END_STREAM) is failed by Connect as "internal: protocol
// error", and the observer logged every internal error as the server's
// own, at error level ("rpc failed"). Server reflection's stream is served
// without a credential, and its message is charged to the anonymous
// budget only once it is read: a client without a credential had the
// server write an error line for each such request, free, as often as it
// sent one (curl on `tether serve`: one a request). A stream whose
// message its caller broke is now logged at debug level, as a refusal is;
// the caller is still answered as before.
func TestRogue45GCATruncatedMessageIsNotLoggedAsTheServersError(t *testing.T) {
	var logged lockedBuffer
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	truncated := []byte{0, 0, 0, 0, 100, 'x'} // promises 100 bytes, holds 1
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"Connect", http.Header{"Content-Type": {"application/connect+proto"}}},
		{"gRPC", http.Header{"Content-Type": {"application/grpc+proto"}, "Te": {"trailers"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := logged.String()
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", bytes.NewReader(truncated))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tc.header // no credential
			resp, err := testserver.H2CClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// The answer (its trailers read) is written after the
			// handler returned and the observer logged it.
			msg := string(body) + resp.Trailer.Get("Grpc-Message")
			if !strings.Contains(msg, "promised 100 bytes") {
				t.Fatalf("%s: %q, want the truncated message refused", resp.Status, msg)
			}
			if lines := strings.Count(strings.TrimPrefix(logged.String(), before), "level=ERROR"); lines > 0 {
				t.Fatalf("a client without a credential had the server log %d errors for its own broken message:\n%s", lines, strings.TrimPrefix(logged.String(), before))
			}
		})
	}
}
