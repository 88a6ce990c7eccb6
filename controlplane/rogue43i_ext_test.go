package controlplane_test

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// TestRogue43IGzipBombOnAPublicEndpointIsNotInflated: the endpoints served
// without a credential on the API's port — gRPC health's Check and server
// reflection's stream — decompressed a message with Connect's stock gzip,
// which, once a message passes the limit, drains the rest of it to report
// its size: anyone who can reach the port had the server inflate a bomb in
// full, each 1 MiB of gzip (the default --max-request-bytes) a GiB of CPU
// work, as often as it sent one (the health check charges no budget; the
// reflection stream charges its message only once it is read). The API's
// services stopped inflating one byte past the limit long ago
// (boundedGzip); the public endpoints now share it, at their own smaller
// limit (controlplane.MaxPublicMessageBytes). Here 3 KiB of gzip inflating
// to 3 MiB: the refusal must not have measured the whole of it ("message
// size 3145728").
func TestRogue43IGzipBombOnAPublicEndpointIsNotInflated(t *testing.T) {
	srv := testserver.Start(t) // the default --max-request-bytes, 1 MiB
	bomb := gzipBomb(t, 3)     // 3 MiB inflated
	if len(bomb) >= controlplane.MaxPublicMessageBytes {
		t.Fatalf("the bomb is %d bytes, not under the public endpoints' limit", len(bomb))
	}
	enveloped := make([]byte, 5, 5+len(bomb))
	enveloped[0] = 1 // compressed
	binary.BigEndian.PutUint32(enveloped[1:], uint32(len(bomb)))
	enveloped = append(enveloped, bomb...)
	for _, tc := range []struct {
		name, path string
		body       []byte
		header     http.Header
	}{
		{"gRPC health Check (Connect unary)", "/grpc.health.v1.Health/Check", bomb,
			http.Header{"Content-Type": {"application/proto"}, "Content-Encoding": {"gzip"}}},
		{"gRPC health Check (gRPC)", "/grpc.health.v1.Health/Check", enveloped,
			http.Header{"Content-Type": {"application/grpc+proto"}, "Grpc-Encoding": {"gzip"}, "Te": {"trailers"}}},
		{"server reflection stream (Connect)", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", enveloped,
			http.Header{"Content-Type": {"application/connect+proto"}, "Connect-Content-Encoding": {"gzip"}}},
		{"server reflection v1alpha stream (gRPC)", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", enveloped,
			http.Header{"Content-Type": {"application/grpc+proto"}, "Grpc-Encoding": {"gzip"}, "Te": {"trailers"}}},
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
			// The refusal's message: Connect's in the body, gRPC's in the
			// trailers.
			if resp.Header.Get("Content-Type") == "application/connect+proto" {
				body = connectStreamText(t, body)
			}
			msg := string(body) + " " + resp.Trailer.Get("Grpc-Message") + " " + resp.Header.Get("Grpc-Message")
			if strings.Contains(msg, "message size ") {
				t.Fatalf("the server inflated the whole bomb to measure it: %s", msg)
			}
			if !strings.Contains(msg, "not inflating the rest") || !strings.Contains(msg, fmt.Sprint(controlplane.MaxPublicMessageBytes)) {
				t.Fatalf("%s: %s, want resource_exhausted naming the limit, the rest not inflated", resp.Status, msg)
			}
		})
	}
}

// TestRogue43IPublicEndpointsDecodeOnlySmallMessages: a public endpoint's
// request is decoded before any budget is charged for it (the health
// check charges none), and was bounded by the API's --max-request-bytes:
// a client without a credential had the server read and decode up to a
// MiB a health check (or, compressed, 1 KiB of gzip inflating to a MiB),
// free, eight at once on every connection it opens. Their requests name a
// service, a file or a symbol: past controlplane.MaxPublicMessageBytes
// they are refused resource_exhausted, undecoded; a real one is answered.
func TestRogue43IPublicEndpointsDecodeOnlySmallMessages(t *testing.T) {
	srv := testserver.Start(t)
	// A HealthCheckRequest naming no service (the server's own health),
	// with 8 KiB of an unknown field (15, bytes) that a decoder skips.
	big := append([]byte{15<<3 | 2, 0x80, 0x40}, make([]byte, 8<<10)...)
	check := func(body []byte) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/grpc.health.v1.Health/Check", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/proto") // no credential
		resp, err := testserver.H2CClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, msg := check(big)
	if resp.StatusCode == http.StatusOK || !strings.Contains(msg, "resource_exhausted") || !strings.Contains(msg, fmt.Sprint(controlplane.MaxPublicMessageBytes)) {
		t.Fatalf("a health check of %d bytes without a credential: %s %q, want resource_exhausted naming the limit of %d", len(big), resp.Status, msg, controlplane.MaxPublicMessageBytes)
	}
	// An orchestrator's check (an empty request) is answered.
	if resp, msg := check(nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("the server's health check: %s %q, want it answered", resp.Status, msg)
	}
}

// connectStreamText is a Connect stream's body with its compressed
// envelopes (the end-stream message among them) inflated.
func connectStreamText(t *testing.T, body []byte) []byte {
	t.Helper()
	var out []byte
	for len(body) >= 5 {
		n := int(binary.BigEndian.Uint32(body[1:5]))
		if len(body) < 5+n {
			t.Fatalf("a truncated envelope: %d bytes of %d", len(body)-5, n)
		}
		msg := body[5 : 5+n]
		if body[0]&1 != 0 {
			zr, err := gzip.NewReader(bytes.NewReader(msg))
			if err != nil {
				t.Fatal(err)
			}
			if msg, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		out = append(append(out, msg...), ' ')
		body = body[5+n:]
	}
	return out
}
