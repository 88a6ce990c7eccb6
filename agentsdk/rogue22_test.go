package agentsdk_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-second hostile pass on the Go SDK: a peer standing where the
// control plane would (a real HTTP/2 server on loopback, startRawPeer)
// that echoes the bearer token it was sent, or sends the Conn elsewhere.

// rogue22Token is a bearer token of a JWT's shape: its signature (the part
// after the last dot) is what makes a copy of it usable.
const (
	rogue22Token     = "eyJhbGciOiJFZERTQSIsImtpZCI6InJvZ3VlIn0.eyJzdWIiOiJyb2d1ZTIyIn0.c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw"
	rogue22Signature = "c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw"
)

// echoedError is a Connect error (JSON) quoting what the peer was sent:
// the token whole in the message, its signature alone in a header and in
// a detail.
func echoedError(t *testing.T, r *http.Request) (string, []byte) {
	t.Helper()
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	sig := token[strings.LastIndex(token, ".")+1:]
	detail, err := proto.Marshal(wrapperspb.String("you sent " + sig))
	if err != nil {
		t.Error(err)
	}
	body, err := json.Marshal(map[string]any{
		"code":    "permission_denied",
		"message": "refused Authorization: Bearer " + token + " (signature " + sig + ")",
		"details": []map[string]string{{"type": "google.protobuf.StringValue", "value": base64.RawStdEncoding.EncodeToString(detail)}},
	})
	if err != nil {
		t.Error(err)
	}
	return sig, body
}

// holdsSecret reports where err, its metadata, details or wrapped errors
// still carry the token or its signature.
func holdsSecret(err error) string {
	has := func(s string) bool { return strings.Contains(s, rogue22Token) || strings.Contains(s, rogue22Signature) }
	for e := err; e != nil; e = errors.Unwrap(e) {
		if has(e.Error()) {
			return "message: " + e.Error()
		}
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		if connect.IsWireError(ce) {
			for k, vs := range ce.Meta() {
				if has(k) || has(strings.Join(vs, ",")) {
					return "metadata " + k + ": " + strings.Join(vs, ",")
				}
			}
		}
		for _, d := range ce.Details() {
			if has(string(d.Bytes())) {
				return "detail " + d.Type()
			}
		}
	}
	return ""
}

// A peer's error that echoes the bearer token (a proxy quoting the
// request it refused, or a hostile control plane) carried it, and its
// signature, into the error a unary call or a stream returned: its
// message, its metadata and its details, which an agent logs. The Conn
// now cuts both out of all three, keeping the code.
func TestRogue22APeersErrorThatEchoesTheBearerTokenReachesNoErrorOfTheConn(t *testing.T) {
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		sig, body := echoedError(t, r)
		w.Header().Set("X-Echo", "token="+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		if strings.HasSuffix(r.URL.Path, "/WatchCancels") {
			w.Header().Set("Content-Type", "application/connect+proto")
			w.WriteHeader(http.StatusOK)
			end, _ := json.Marshal(map[string]any{"error": json.RawMessage(body), "metadata": map[string][]string{"x-sig": {sig}}})
			w.Write(append([]byte{2, byte(len(end) >> 24), byte(len(end) >> 16), byte(len(end) >> 8), byte(len(end))}, end...))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Sig", sig)
		w.WriteHeader(http.StatusForbidden)
		w.Write(body)
	})
	conn := agentsdk.Dial(url, rogue22Token)
	_, err := conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("WhoAmI: %v, want the peer's permission_denied", err)
	}
	if where := holdsSecret(err); where != "" {
		t.Errorf("a unary call's error carries the bearer token or its signature (%s)", where)
	}
	if !strings.Contains(err.Error(), "[bearer token]") {
		t.Errorf("the message says nothing of what was cut: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := conn.Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "rogue22"}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodePermissionDenied {
		t.Fatalf("WatchCancels: %v, want the peer's permission_denied", stream.Err())
	}
	if where := holdsSecret(stream.Err()); where != "" {
		t.Errorf("a stream's error carries the bearer token or its signature (%s)", where)
	}
	stream.Close()
}

// A verifier logs why its key set or revocation feed failed: a peer whose
// key set names a key by the verifier's own token (the verifier's Conn
// sent it on the feed) put it in the verifier's log, and its feed's error
// did too. Neither log line carries the token nor its signature now.
func TestRogue22AVerifiersLogCarriesNoTokenAPeerEchoed(t *testing.T) {
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == agentsdk.JWKSPath {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"` + rogue22Token + `","x":"not-a-key"}]}`))
			return
		}
		_, body := echoedError(t, r)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		w.Write(body)
	})
	lines := make(chan string, 64)
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{
		Conn:   agentsdk.Dial(url, rogue22Token),
		Logger: slog.New(slog.NewTextHandler(lineWriter(lines), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	defer func() { cancel(); <-done }()
	seen := map[string]bool{}
	timeout := time.After(30 * time.Second)
	for !seen["key set"] || !seen["revocation feed"] {
		select {
		case line := <-lines:
			if strings.Contains(line, rogue22Token) || strings.Contains(line, rogue22Signature) {
				t.Errorf("the verifier logged the bearer token or its signature: %s", line)
			}
			for _, what := range []string{"key set", "revocation feed"} {
				if strings.Contains(line, what) {
					seen[what] = true
				}
			}
		case <-timeout:
			t.Fatalf("the verifier logged %v of its key set's and feed's failures in 30s", seen)
		}
	}
}

// lineWriter hands each log line to a test, dropping what it has no room
// for: a verifier that goes on logging after the test read its fill is
// never held.
type lineWriter chan string

func (w lineWriter) Write(b []byte) (int, error) {
	select {
	case w <- string(b):
	default:
	}
	return len(b), nil
}

// A control plane's answer of 307 or 308 sent the Conn, and its bearer
// token, wherever its Location said (Go's client keeps Authorization on a
// redirect to the same host, another port or path included), and the
// verifier took its key set from there. The Conn now follows no redirect:
// the call fails saying so, and the target sees nothing.
func TestRogue22AConnFollowsNoRedirect(t *testing.T) {
	var hits atomic.Int32
	var sawToken atomic.Bool
	target := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "" {
			sawToken.Store(true)
		}
		if r.URL.Path == agentsdk.JWKSPath {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"keys":[]}`))
			return
		}
		answerProto(w, &tetherv1.WhoAmIResponse{NodeId: "n-elsewhere"})
	})
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target+r.URL.Path, status)
		})
		conn := agentsdk.Dial(url, rogue22Token)
		resp, err := conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if err == nil {
			t.Errorf("a %d was followed: WhoAmI answered %q", status, resp.Msg.NodeId)
		} else if !strings.Contains(err.Error(), "redirect") {
			t.Errorf("a %d: %v, want an error that says the redirect was not followed", status, err)
		}

		lines := make(chan string, 64)
		v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: conn, Logger: slog.New(slog.NewTextHandler(lineWriter(lines), nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- v.Run(ctx) }()
		// Run fetches the key set before it follows the feed: its first
		// line is about the key set unless the fetch succeeded.
		select {
		case line := <-lines:
			if !strings.Contains(line, "key set") || !strings.Contains(line, "redirect") {
				t.Errorf("a %d of the key set: the verifier's first log line is %s, want a key-set failure that says the redirect was not followed", status, line)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("a %d of the key set: the verifier logged nothing in 30s", status)
		}
		cancel()
		<-done
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirects' target was asked %d times (bearer token presented: %v), want never", n, sawToken.Load())
	}
}
