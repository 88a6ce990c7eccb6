package controlplane_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/tetherhq/tether/controlplane/testserver"
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
