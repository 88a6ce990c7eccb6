package agentsdk_test

import (
	"context"
	"errors"
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

// The forty-third hostile pass on the Go SDK (letter L).

// rogue43lPath is a hostile element on a tool server's path to the
// control plane (a proxy's, a peer's): it holds the gate's first
// WatchCancels stream open and relays nothing of it, and relays every
// other request, and every later stream, honestly. It counts the streams
// the gate opened.
type rogue43lPath struct {
	next    http.RoundTripper
	watches atomic.Int32
}

func (p *rogue43lPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/WatchCancels") {
		return p.next.RoundTrip(r)
	}
	first := p.watches.Add(1) == 1
	resp, err := p.next.RoundTrip(r)
	if !first || err != nil {
		return resp, err
	}
	resp.Body = &rogue43lSilentBody{upstream: resp.Body, ctx: r.Context()}
	return resp, nil
}

// rogue43lSilentBody relays nothing: every read waits until the request
// ends.
type rogue43lSilentBody struct {
	upstream io.ReadCloser
	ctx      context.Context
}

func (b *rogue43lSilentBody) Read([]byte) (int, error) {
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (b *rogue43lSilentBody) Close() error { return b.upstream.Close() }

// A hostile element on a tool server's path holds the gate's WatchCancels
// stream open and silent. The stream carries cancel orders only, so its
// silence is what an honest control plane with nothing to cancel sends
// too: the gate waited on it for good, deaf to every cancel order even
// once the path was honest again. The agent being stopped had its tool run
// on past the cancel its abort ordered (and the abort recorded the gate's
// cancel unacknowledged). Now a gate with a call in flight opens its
// stream anew every agentsdk.CancelWatchRefresh (the control plane sends
// every pending order again on a new stream), and the handler is
// cancelled.
func TestRogue43LSilentCancelStreamDoesNotDeafenTheGate(t *testing.T) {
	defer agentsdk.SetCancelWatchRefresh(100 * time.Millisecond)()
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	path := &rogue43lPath{next: operator.HTTP.Transport}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(&http.Client{Transport: path})), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	running := make(chan struct{})
	cancelled := make(chan error, 1)
	guard := make(chan struct{}) // closed at the test's end: a guard against the hang
	defer close(guard)
	called := make(chan error, 1)
	go func() {
		called <- gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
			close(running)
			select {
			case <-ctx.Done():
				cancelled <- context.Cause(ctx)
				return ctx.Err()
			case <-guard:
				return errors.New("the test ended with the tool still running")
			}
		})
	}()
	<-running
	if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), Reason: "rogue43l",
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, agentsdk.ErrCancelled) {
			t.Fatalf("the tool's context ended with %v, want ErrCancelled", cause)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatalf("the gate is deaf: its tool still running 20 s (200 refresh intervals) after its abort was ordered; %d WatchCancels stream(s) opened, the stalled one still waited on", path.watches.Load())
	}
	if err := <-called; !errors.Is(err, agentsdk.ErrCancelled) {
		t.Fatalf("Call returned %v, want ErrCancelled (the cancel acknowledged)", err)
	}
	if n := path.watches.Load(); n < 2 {
		t.Fatalf("the order heard on %d stream(s): the stalled one relayed it", n)
	}
}
