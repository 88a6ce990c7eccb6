package agentsdk_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-second hostile pass on the Go SDK and the launcher (letter J).

// silentPath is a hostile element on a client's path to the control plane
// (a proxy's, a peer's): on the first stream of the RPC whose path ends in
// suffix, it relays the control plane's first message if relayFirst (a
// session's opened) and then nothing more, holding the stream open. It
// relays every other request, and every later stream, honestly. It counts
// the streams opened (opened).
type silentPath struct {
	next       http.RoundTripper
	suffix     string
	relayFirst bool
	opened     atomic.Int32
}

func (p *silentPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, p.suffix) {
		return p.next.RoundTrip(r)
	}
	first := p.opened.Add(1) == 1
	resp, err := p.next.RoundTrip(r)
	if !first || err != nil {
		return resp, err
	}
	resp.Body = &silentBody{upstream: resp.Body, ctx: r.Context(), relayed: !p.relayFirst}
	return resp, nil
}

// silentBody relays the first envelope of the upstream body (unless
// relayed is set from the start), then holds every read until the request
// ends.
type silentBody struct {
	upstream io.ReadCloser
	ctx      context.Context
	out      bytes.Buffer
	relayed  bool
}

func (b *silentBody) Read(p []byte) (int, error) {
	if !b.relayed {
		b.relayed = true
		if err := relayFirstEnvelope(b.upstream, &b.out); err != nil {
			return 0, err
		}
	}
	if b.out.Len() > 0 {
		return b.out.Read(p)
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (b *silentBody) Close() error { return b.upstream.Close() }

// A hostile element on the agent's path (a proxy that stalls the stream,
// a peer) holds the agent's session open and silent: the agent's
// heartbeats go out, the control plane's answers (its acknowledgements,
// the node's signals) never come back. The Go agent waited on that
// stream for good — deaf to its node's stop once the path was honest
// again, since it never opened another session. Now a session whose
// heartbeats go unanswered (agentsdk.MaxUnansweredHeartbeats in a row:
// the control plane acknowledges each) is ended and another opened, and
// the agent hears the drain.
func TestRogue42JASilentSessionDoesNotDeafenTheAgent(t *testing.T) {
	ctx := context.Background()
	srv, operator, root := embeddedRoot(t, "root")
	child := spawnChild(t, root, "child")
	// On the agent's path: the first session relays the control plane's
	// first message (the session's opened) and then nothing more — the
	// agent's heartbeats still reach the control plane, its answers never
	// reach the agent.
	path := &silentPath{next: agentsdk.HTTP2Client(srv.URL).Transport, suffix: "/Session", relayFirst: true}
	agent, err := agentsdk.Join(ctx, srv.URL, child.Credential, &http.Client{Transport: path})
	if err != nil {
		t.Fatal(err)
	}
	agent.HeartbeatEvery = 50 * time.Millisecond
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- agent.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-ran })
	<-agent.Opened() // the stalled session's opened, relayed
	if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(time.Hour),
	})); err != nil {
		t.Fatal(err)
	}
	guard := time.After(20 * time.Second) // a guard against the hang, not a timing
	select {
	case <-agent.Draining():
		if n := path.opened.Load(); n < 2 {
			t.Fatalf("the drain heard on %d session(s): the stalled one relayed it", n)
		}
	case err := <-ran:
		t.Fatalf("Run returned %v before the drain was heard", err)
	case <-guard:
		t.Fatalf("the agent is deaf: the drain not heard 20 s after it was ordered (400 heartbeat intervals); %d session(s) opened, the stalled one still waited on", path.opened.Load())
	}
}
