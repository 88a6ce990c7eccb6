package agentsdk_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twentieth hostile pass on the Go SDK: the control plane as a peer
// that misbehaves. The peer is a real HTTP/2 (h2c) server on loopback
// standing where the control plane would, writing the Connect protocol's
// bytes itself, so that it can answer what no Connect server would.

// startRawPeer serves handler on a loopback port over h2c and returns its
// base URL.
func startRawPeer(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: handler, Protocols: protocols}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// An answer of 17 MiB, or one that inflates to it: the Go Conn took
// connect's default bound (4 GiB) and read whatever its peer sent, so a
// peer gone wrong (a proxy's, or a hostile one's answer) could fill the
// agent's memory; the TypeScript and Python Conns stop at 16 MiB. A
// stream's message is bounded alike (a gate's cancel orders, a verifier's
// revocation feed).
func TestAConnRefusesAnAnswerLargerThanAnyTheControlPlaneSends(t *testing.T) {
	huge, err := proto.Marshal(&tetherv1.WhoAmIResponse{NodeId: strings.Repeat("n", 17<<20)})
	if err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(huge)
	zw.Close()
	streamed := append([]byte{0, 0, 0, 0, 0}, huge...)
	streamed[1], streamed[2], streamed[3], streamed[4] = byte(len(huge)>>24), byte(len(huge)>>16), byte(len(huge)>>8), byte(len(huge))

	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/WhoAmI") && r.Header.Get("X-Inflate") == "":
			w.Header().Set("Content-Type", "application/proto")
			w.Write(huge)
		case strings.HasSuffix(r.URL.Path, "/WhoAmI"):
			w.Header().Set("Content-Type", "application/proto")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(zipped.Bytes())
		case strings.HasSuffix(r.URL.Path, "/WatchCancels"):
			w.Header().Set("Content-Type", "application/connect+proto")
			w.Write(streamed)
			w.Write([]byte{2, 0, 0, 0, 2, '{', '}'})
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	})
	conn := agentsdk.Dial(url, "rogue20-token")
	ctx := context.Background()

	_, err = conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("an answer of 17 MiB as it comes: %v, want resource_exhausted", err)
	}
	req := connect.NewRequest(&tetherv1.WhoAmIRequest{})
	req.Header().Set("X-Inflate", "1")
	_, err = conn.Auth.WhoAmI(ctx, req)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("an answer that inflates to 17 MiB: %v, want resource_exhausted", err)
	}
	stream, err := conn.Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "rogue20-gate"}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if stream.Receive() {
		t.Fatalf("a stream's message of 17 MiB was read (%d bytes of call id)", len(stream.Msg().CallId))
	}
	if connect.CodeOf(stream.Err()) != connect.CodeResourceExhausted {
		t.Fatalf("a stream's message of 17 MiB: %v, want resource_exhausted", stream.Err())
	}
}

// The bound is the Conn's default: a caller that expects more raises it,
// as for any Connect client option.
func TestAConnsAnswerBoundCanBeRaised(t *testing.T) {
	huge, err := proto.Marshal(&tetherv1.WhoAmIResponse{NodeId: strings.Repeat("n", 17<<20)})
	if err != nil {
		t.Fatal(err)
	}
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/proto")
		w.Write(huge)
	})
	conn := agentsdk.Dial(url, "rogue20-token", agentsdk.WithClientOptions(connect.WithReadMaxBytes(32<<20)))
	who, err := conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		t.Fatalf("an answer of 17 MiB under a bound of 32 MiB: %v", err)
	}
	if len(who.Msg.NodeId) != 17<<20 {
		t.Fatalf("read %d bytes of node id", len(who.Msg.NodeId))
	}
}

// A key set that trickles (a byte now and then, each soon enough to beat
// any read timeout): the Go verifier's fetch had no deadline of its own,
// so Run never got past its first fetch to follow the revocation feed
// (every check failed closed, for as long as the peer liked), and every
// check of a token with an unknown kid waited behind it. The TypeScript
// verifier gives a fetch 10 s, the Python one its connection's timeout.
// The fetch's bound is VerifierConfig.JWKSFetchTimeout (default 10 s, as
// the TypeScript verifier's): the test gives it 100 ms, so as not to wait
// 10 s of real time for it.
func TestAVerifierGivesUpAKeySetThatTrickles(t *testing.T) {
	watched := make(chan struct{}, 1)
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == agentsdk.JWKSPath:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-r.Context().Done(): // the verifier gave up
					return
				case <-tick.C:
					w.Write([]byte(" "))
					w.(http.Flusher).Flush()
				}
			}
		case strings.HasSuffix(r.URL.Path, "/WatchRevocations"):
			select {
			case watched <- struct{}{}:
			default:
			}
			http.Error(w, "not now", http.StatusServiceUnavailable)
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	})
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(url, "rogue20-token"), JWKSFetchTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	// A bound, not a timing: Run follows the feed once the fetch has been
	// given up, or never.
	select {
	case <-watched:
	case <-time.After(2 * time.Minute):
		t.Fatal("the verifier still reads a key set that never ends: it never followed the revocation feed")
	}
}
