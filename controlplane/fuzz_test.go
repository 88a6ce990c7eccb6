package controlplane_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tetherhq/tether/internal/testserver"
)

// unaryProcedures lists every unary procedure of tether.v1.
func unaryProcedures(t testing.TB) []string {
	var out []string
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				m := sd.Methods().Get(j)
				if m.IsStreamingClient() || m.IsStreamingServer() {
					continue
				}
				out = append(out, "/"+string(sd.FullName())+"/"+string(m.Name()))
			}
		}
		return true
	})
	if len(out) < 30 {
		t.Fatalf("found %d unary procedures", len(out))
	}
	return out
}

// FuzzRequestDecoding sends arbitrary bodies, as Connect protobuf and as
// Connect JSON, to every unary procedure of the real handler, with a valid
// admin token so that decoding and validation are reached. Whatever the
// input, the server answers with a client error or success — never an
// internal error, never a panic.
func FuzzRequestDecoding(f *testing.F) {
	f.Add(uint16(0), []byte(`{}`), true)
	f.Add(uint16(1), []byte(`{"name":"fuzz","labels":{"a":"b"}}`), true)
	f.Add(uint16(2), []byte(`{"parentNodeId":"n_00000000000000000000","name":"x"}`), true)
	f.Add(uint16(3), []byte{0x0a, 0x03, 'a', 'b', 'c'}, false)
	f.Add(uint16(4), []byte(`{"nodeId":"`+strings.Repeat("z", 300)+`"}`), true)
	f.Add(uint16(5), []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, false)
	fuzzSrv := testserver.Start(f)
	procs := unaryProcedures(f)
	f.Fuzz(func(t *testing.T, which uint16, body []byte, asJSON bool) {
		proc := procs[int(which)%len(procs)]
		req := httptest.NewRequest(http.MethodPost, proc, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+fuzzSrv.Admin)
		if asJSON {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/proto")
		}
		rec := httptest.NewRecorder()
		fuzzSrv.Handler().ServeHTTP(rec, req)
		if rec.Code/100 == 2 {
			return
		}
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code >= 500 && e.Code != "unavailable" && e.Code != "unimplemented" {
			t.Fatalf("%s with %q: HTTP %d %s: %s", proc, body, rec.Code, e.Code, e.Message)
		}
		if strings.Contains(e.Message, fuzzSrv.Admin) {
			t.Fatalf("%s: the error echoes the token", proc)
		}
	})
}
