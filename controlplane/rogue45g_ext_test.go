package controlplane_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

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
