package agentsdk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-first hostile pass on the capability tree and the Go SDK's
// handling of the credential it is handed (letter I).

// rogue41iPath is a hostile element on the agent's path to the control
// plane (a proxy's, a peer's): on the first session it relays the
// control plane's first message, then adds a session message of its own
// carrying credential as the node's refreshed credential, then breaks the
// stream. From then on it relays honestly. It counts the sessions the
// agent opened after its answer: those that left the process (reached
// the control plane) and those the agent's own transport refused.
type rogue41iPath struct {
	next       http.RoundTripper
	credential string

	mu       sync.Mutex
	answered bool
	// after its answer: sessions the server took, and those that failed
	// in the agent's process or at the server's headers.
	reached, refused atomic.Int32
}

func (p *rogue41iPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/Session") {
		return p.next.RoundTrip(r)
	}
	p.mu.Lock()
	first := !p.answered
	p.answered = true
	p.mu.Unlock()
	resp, err := p.next.RoundTrip(r)
	if !first {
		if err != nil || resp.StatusCode != http.StatusOK {
			p.refused.Add(1)
		} else {
			p.reached.Add(1)
		}
		return resp, err
	}
	if err != nil {
		return nil, err
	}
	msg, err := proto.Marshal(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Credential{
		Credential: &tetherv1.SessionCredential{Credential: p.credential},
	}})
	if err != nil {
		return nil, err
	}
	resp.Body = &rogue41iBody{upstream: resp.Body, injected: msg}
	return resp, nil
}

// rogue41iBody relays the first envelope of the upstream body, then its
// own, then fails as a broken path does.
type rogue41iBody struct {
	upstream io.ReadCloser
	injected []byte
	out      bytes.Buffer
	done     bool
}

func (b *rogue41iBody) Read(p []byte) (int, error) {
	if !b.done {
		b.done = true
		if err := relayFirstEnvelope(b.upstream, &b.out); err != nil {
			return 0, err
		}
		var mine [5]byte
		binary.BigEndian.PutUint32(mine[1:], uint32(len(b.injected)))
		b.out.Write(mine[:])
		b.out.Write(b.injected)
	}
	if b.out.Len() > 0 {
		return b.out.Read(p)
	}
	return 0, errors.New("the path broke")
}

func (b *rogue41iBody) Close() error { return b.upstream.Close() }

// A hostile element on the agent's path (or a hostile control plane's
// answer) hands the Go agent, as its refreshed credential, text the agent
// cannot present: a line break a header cannot carry, more than the
// control plane's headers take, a space. The agent presented it from then
// on: every reconnect failed in its own transport (unavailable) or was
// refused at the server's header limit, for good, once the path was honest
// again, and the agent never heard its node's drain; text with a space the
// control plane refused, and the agent aborted itself, a stop nobody
// ordered. Now the agent keeps its credential unless the answer's could
// be one (a compact JWS within capability.MaxTokenBytes), reconnects with
// it and hears the drain.
func TestRogue41IARefreshedCredentialTheAgentCannotPresentDoesNotDeafenIt(t *testing.T) {
	ctx := context.Background()
	srv, operator, root := embeddedRoot(t, "root")
	for _, tc := range []struct{ name, credential string }{
		{"a line break", "eyJhbGciOiJFZERTQSJ9.e30.c2ln\r\nX-Rogue: 1"},
		{"more than a header takes", strings.Repeat("a", 80<<10) + ".e30.c2ln"},
		{"a space", "not a credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			child, err := root.Spawn(ctx, "child", nil)
			if err != nil {
				t.Fatal(err)
			}
			path := &rogue41iPath{next: agentsdk.HTTP2Client(srv.URL).Transport, credential: tc.credential}
			agent, err := agentsdk.Join(ctx, srv.URL, child.Credential, &http.Client{Transport: path})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- agent.Run(runCtx) }()
			t.Cleanup(func() { cancel(); <-ran })
			if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
				DrainWindow: durationpb.New(time.Hour),
			})); err != nil {
				t.Fatal(err)
			}
			// The drain is heard on the first session the agent opens over
			// the honest path; four that never reached the server (a
			// backoff of 1.5 s in all) say it is not going to be.
			guard := time.After(20 * time.Second) // a guard against the hang, not a timing
			for {
				select {
				case <-agent.Draining():
					if agent.Context().Err() != nil {
						t.Fatalf("the agent aborted itself (%v) on a drain", context.Cause(agent.Context()))
					}
					return
				case err := <-ran:
					ran <- err
					t.Fatalf("the agent aborted itself, a stop nobody ordered: Run returned %v; %d sessions reached the server after the rogue's answer", err, path.reached.Load())
				case <-guard:
					t.Fatalf("the drain not heard 20 s after it was ordered: %d sessions taken after the rogue's answer, %d failed in the agent's process or at the server's headers", path.reached.Load(), path.refused.Load())
				case <-time.After(10 * time.Millisecond):
				}
				if n := path.refused.Load(); n >= 4 && path.reached.Load() == 0 {
					t.Fatalf("the agent is deaf: %d sessions after the rogue's answer failed in its own process or at the server's headers, none taken, the drain not heard", n)
				}
			}
		})
	}
}

// relayFirstEnvelope copies the first Connect envelope (its 5-byte head
// and its message) of upstream into out, as a path relays it.
func relayFirstEnvelope(upstream io.Reader, out *bytes.Buffer) error {
	var head [5]byte
	if _, err := io.ReadFull(upstream, head[:]); err != nil {
		return err
	}
	body := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(upstream, body); err != nil {
		return err
	}
	out.Write(head[:])
	out.Write(body)
	return nil
}
