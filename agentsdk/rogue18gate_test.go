package agentsdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The eighteenth hostile pass, for the Go gate as for the TypeScript and
// Python ones: a gate kept every cancel order for a call it had not
// registered, for ever. Orders for calls it never began (a previous
// process's, replayed by WatchCancels on each reconnect, or a hostile
// peer's made-up ids) grew its memory without bound. The peer here is a
// real HTTP/2 (h2c) Connect server on loopback standing where the control
// plane would: its first watch floods orders for made-up ids, its second
// stays open and carries the test's orders; BeginCall waits for the test.
type floodingTools struct {
	tetherv1connect.UnimplementedToolServiceHandler
	flood   int
	watches atomic.Int32
	second  chan chan string // the held watch's orders, handed to the test
	begun   chan chan string // a begin waiting for its call id
}

func (f *floodingTools) WatchCancels(ctx context.Context, _ *connect.Request[tetherv1.WatchCancelsRequest], stream *connect.ServerStream[tetherv1.WatchCancelsResponse]) error {
	if f.watches.Add(1) == 1 {
		for i := range f.flood {
			if err := stream.Send(&tetherv1.WatchCancelsResponse{CallId: fmt.Sprintf("made-up-%d", i)}); err != nil {
				return err
			}
		}
		return nil
	}
	orders := make(chan string)
	f.second <- orders
	for {
		select {
		case <-ctx.Done():
			return nil
		case id := <-orders:
			if err := stream.Send(&tetherv1.WatchCancelsResponse{CallId: id}); err != nil {
				return err
			}
		}
	}
}

func (f *floodingTools) BeginCall(ctx context.Context, _ *connect.Request[tetherv1.BeginCallRequest]) (*connect.Response[tetherv1.BeginCallResponse], error) {
	answer := make(chan string)
	f.begun <- answer
	select {
	case id := <-answer:
		if id == "" {
			return connect.NewResponse(&tetherv1.BeginCallResponse{}), nil // an answer without its call
		}
		return connect.NewResponse(&tetherv1.BeginCallResponse{Call: &tetherv1.ToolCall{CallId: id, Tool: "shell"}}), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *floodingTools) CancelAck(context.Context, *connect.Request[tetherv1.CancelAckRequest]) (*connect.Response[tetherv1.CancelAckResponse], error) {
	return connect.NewResponse(&tetherv1.CancelAckResponse{}), nil
}

// startFloodingTools serves peer on a loopback port over h2c and returns
// a gate dialled to it.
func startFloodingTools(t *testing.T, peer *floodingTools) *agentsdk.ToolGate {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(tetherv1connect.NewToolServiceHandler(peer))
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: protocols}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	gate := agentsdk.NewToolGate(agentsdk.Dial("http://"+ln.Addr().String(), "rogue18-tool-token"), "go-rogue18-gate")
	t.Cleanup(gate.Close)
	return gate
}

func TestAGateKeepsNoCancelOrderForACallItNeverBegan(t *testing.T) {
	peer := &floodingTools{flood: 5000, second: make(chan chan string, 1), begun: make(chan chan string, 1)}
	gate := startFloodingTools(t, peer)

	// The gate has read the whole flood once it watches again.
	orders := <-peer.second
	if n := gate.HeldOrders(); n != 0 {
		t.Fatalf("the gate keeps %d orders for calls it never began", n)
	}

	// A real early order: it comes while this gate's begin waits for its
	// answer, and the answer names its call.
	var wg sync.WaitGroup
	var callErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		callErr = gate.Call(context.Background(), "a-capability-token", "shell", func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	answer := <-peer.begun
	orders <- "call-early"
	for gate.HeldOrders() != 1 { // the order is read on the gate's own goroutine
		runtime.Gosched()
	}
	answer <- "call-early"
	wg.Wait()
	if !errors.Is(callErr, agentsdk.ErrCancelled) {
		t.Fatalf("the early order did not cancel its call: %v", callErr)
	}
	if n := gate.HeldOrders(); n != 0 {
		t.Fatalf("the gate keeps %d orders after its call took its own", n)
	}
}

// A BeginCall answer without its call (a proxy's, or a hostile peer's)
// dereferenced a nil call: the goroutine calling the gate panicked, and
// with it the tool server's process.
func TestABeginAnswerWithoutItsCallIsAnErrorNotAPanic(t *testing.T) {
	peer := &floodingTools{second: make(chan chan string, 1), begun: make(chan chan string, 1)}
	gate := startFloodingTools(t, peer)
	go func() { (<-peer.begun) <- "" }()
	ran := false
	err := gate.Call(context.Background(), "a-capability-token", "shell", func(context.Context) error {
		ran = true
		return nil
	})
	if err == nil || ran {
		t.Fatalf("a begin answered without its call: err %v, the tool ran %v", err, ran)
	}
	if n := gate.HeldOrders(); n != 0 {
		t.Fatalf("the gate keeps %d orders", n)
	}
}
