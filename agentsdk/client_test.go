package agentsdk_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A token a header cannot carry (a file's newline, a CRLF with a header of
// its own, a space) is never sent, and the error never quotes it: the same
// probe as the TypeScript and Python SDKs' tests.
func TestATokenAHeaderCannotCarryIsNotQuoted(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	tok := srv.AdminToken
	for _, bad := range []string{tok + "\n", tok + "\r\nX-Evil: 1", tok[:20] + " " + tok[20:]} {
		conn := agentsdk.Dial(srv.URL, bad)
		_, err := conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if err == nil {
			t.Fatalf("a token with %q was accepted", bad[len(bad)-2:])
		}
		if strings.Contains(err.Error(), tok[:40]) {
			t.Fatalf("the error quotes the token: %.80s", err)
		}
	}
	if _, err := agentsdk.Dial(srv.URL, tok).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatal(err)
	}
}

// UnaryHTTP1Client sends unary calls over HTTP/1.1 and everything else
// over HTTP/2, through the real server: what each answer came back on is
// recorded beside the request's content type.
func TestUnaryHTTP1ClientSendsUnaryCallsOverHTTP1(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	hc := agentsdk.UnaryHTTP1Client(srv.URL, nil, 2)
	rec := &protoRecorder{next: hc.Transport}
	hc.Transport = rec
	conn := agentsdk.Dial(srv.URL, srv.AdminToken, agentsdk.WithHTTPClient(hc))
	for range 3 {
		if _, err := conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := conn.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("the revocation feed sent nothing: %v", stream.Err())
	}
	stream.Close()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen["application/proto"]) != 3 || len(rec.seen["application/connect+proto"]) != 1 {
		t.Fatalf("recorded %v, want 3 unary calls and 1 stream", rec.seen)
	}
	for _, major := range rec.seen["application/proto"] {
		if major != 1 {
			t.Fatalf("a unary call was answered over HTTP/%d", major)
		}
	}
	if major := rec.seen["application/connect+proto"][0]; major != 2 {
		t.Fatalf("the stream was answered over HTTP/%d", major)
	}
}

// protoRecorder records the HTTP version of each answer by the request's
// content type.
type protoRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen map[string][]int
}

func (p *protoRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(r)
	if err == nil {
		p.mu.Lock()
		if p.seen == nil {
			p.seen = make(map[string][]int)
		}
		ct := r.Header.Get("Content-Type")
		p.seen[ct] = append(p.seen[ct], resp.ProtoMajor)
		p.mu.Unlock()
	}
	return resp, err
}
