package controlplane_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// procedure is one RPC of tether.v1 and whether the server streams it.
type procedure struct {
	path            string
	serverStreaming bool
}

// fuzzProcedures lists every procedure of tether.v1 whose request is a
// single message: the unary ones and the server streams. (The two
// bidirectional streams, Session and Channel, are FuzzStreamMessages.)
func fuzzProcedures(t testing.TB) []procedure {
	var out []procedure
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				m := sd.Methods().Get(j)
				if m.IsStreamingClient() {
					continue
				}
				out = append(out, procedure{path: "/" + string(sd.FullName()) + "/" + string(m.Name()), serverStreaming: m.IsStreamingServer()})
			}
		}
		return true
	})
	if len(out) < 30 {
		t.Fatalf("found %d procedures", len(out))
	}
	return out
}

// FuzzRequestDecoding sends arbitrary bodies, as Connect protobuf and as
// Connect JSON, to every procedure with a single request message (unary
// and server streams) of the real handler, with a valid admin token or an
// agent credential so that decoding and validation are reached on the
// operators' and the agents' procedures. Whatever the input, the server
// answers with a client error or success — never an internal error,
// never a panic. A server stream's call is cancelled before it starts, so
// the handler decodes, validates and returns.
func FuzzRequestDecoding(f *testing.F) {
	f.Add(uint16(0), []byte(`{}`), true, false)
	f.Add(uint16(1), []byte(`{"name":"fuzz","labels":{"a":"b"}}`), true, false)
	f.Add(uint16(2), []byte(`{"parentNodeId":"n_00000000000000000000","name":"x"}`), true, true)
	f.Add(uint16(3), []byte{0x0a, 0x03, 'a', 'b', 'c'}, false, false)
	f.Add(uint16(4), []byte(`{"nodeId":"`+strings.Repeat("z", 300)+`"}`), true, true)
	f.Add(uint16(5), []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, false, true)
	fuzzSrv := testserver.Start(f)
	agent, err := fuzzSrv.AdminClients().Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "fuzzer"}))
	if err != nil {
		f.Fatal(err)
	}
	procs := fuzzProcedures(f)
	f.Fuzz(func(t *testing.T, which uint16, body []byte, asJSON, asAgent bool) {
		proc := procs[int(which)%len(procs)]
		token := fuzzSrv.Admin
		if asAgent {
			token = agent.Msg.Credential
		}
		var req *http.Request
		codec := "proto"
		if asJSON {
			codec = "json"
		}
		if proc.serverStreaming {
			// One envelope: flags, big-endian length, the message.
			framed := make([]byte, 5, 5+len(body))
			binary.BigEndian.PutUint32(framed[1:], uint32(len(body)))
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			req = httptest.NewRequestWithContext(ctx, http.MethodPost, proc.path, bytes.NewReader(append(framed, body...)))
			req.Header.Set("Content-Type", "application/connect+"+codec)
		} else {
			req = httptest.NewRequest(http.MethodPost, proc.path, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/"+codec)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		fuzzSrv.Handler().ServeHTTP(rec, req)
		code, message := connectError(rec, proc.serverStreaming)
		switch code {
		case "", "canceled", "unavailable", "unimplemented":
		case "internal", "unknown", "data_loss":
			t.Fatalf("%s with %q: %s: %s", proc.path, body, code, message)
		}
		if strings.Contains(message, token) {
			t.Fatalf("%s: the error echoes the token", proc.path)
		}
	})
}

// connectError extracts the Connect error of a recorded response: the
// JSON body of a failed unary call, or a stream's end-of-stream message.
func connectError(rec *httptest.ResponseRecorder, streaming bool) (code, message string) {
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if !streaming {
		if rec.Code/100 == 2 {
			return "", ""
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if e.Code == "" {
			e.Code = "unknown"
		}
		return e.Code, e.Message
	}
	b := rec.Body.Bytes()
	for len(b) >= 5 {
		flags, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			return "unknown", "truncated stream"
		}
		msg := b[5 : 5+n]
		b = b[5+n:]
		if flags&0x02 != 0 {
			var end struct {
				Error *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			_ = json.Unmarshal(msg, &end)
			if end.Error == nil {
				return "", ""
			}
			return end.Error.Code, end.Error.Message
		}
	}
	if rec.Code/100 != 2 {
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		return e.Code, e.Message
	}
	return "", ""
}

// FuzzStreamMessages covers the bidirectional streams' messages: any bytes,
// as protobuf or JSON, decoded as a Channel message and turned into a
// lease message the way the stream does (wire.ChannelMessage), and
// as a Session message. Nothing panics, and what the Channel accepts is a
// message the state machine can judge: a malformed message is refused at
// the edge, never judged.
func FuzzStreamMessages(f *testing.F) {
	for _, m := range []proto.Message{
		&tetherv1.ChannelRequest{CorrelationId: 1, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "j", LeaseId: "l_00000000000000000000", LeaseGeneration: 1, RenewSequence: 1}}},
		&tetherv1.ChannelRequest{CorrelationId: 2, Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: "j", LeaseId: "l", LeaseGeneration: 1, ProgressSequence: 1, ProgressValue: "half"}}},
		&tetherv1.ChannelRequest{CorrelationId: 3, Message: &tetherv1.ChannelRequest_Complete{Complete: &tetherv1.CompleteRequest{JobId: "j", LeaseId: "l", LeaseGeneration: 1, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS}}},
		&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: "n_00000000000000000000"}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b, false)
		j, _ := protojson.Marshal(m)
		f.Add(j, true)
	}
	policy := lease.DefaultPolicy()
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		unmarshal := func(m proto.Message) error {
			if asJSON {
				return protojson.Unmarshal(body, m)
			}
			return proto.Unmarshal(body, m)
		}
		var session tetherv1.SessionRequest
		_ = unmarshal(&session)
		var req tetherv1.ChannelRequest
		if unmarshal(&req) != nil {
			return
		}
		m, err := wire.ChannelMessage(&req, "n_00000000000000000001")
		if err != nil {
			if !errors.Is(err, coordinator.ErrInvalidArgument) {
				t.Fatalf("a malformed message is refused with %v, not as invalid", err)
			}
			return
		}
		if err := lease.Validate(m, policy); err != nil {
			t.Fatalf("the Channel accepted %#v, which the state machine refuses to judge: %v", m, err)
		}
	})
}
