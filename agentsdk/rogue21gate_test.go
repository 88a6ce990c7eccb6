package agentsdk_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A hostile control plane floods a gate's cancel orders, while one of its
// begins is under way, with call ids of 64 KiB: the gate held up to
// MaxEarlyOrders of them whatever their size (up to a message's 16 MiB
// each). It holds none longer than any call id the control plane issues.
func TestRogue21AGateHoldsNoOrderForACallIDNoControlPlaneIssues(t *testing.T) {
	orders := make(chan []byte)
	begins := make(chan int, 2)
	release := make(chan struct{})
	var begun atomic.Int64
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/WatchCancels"):
			w.Header().Set("Content-Type", "application/connect+proto")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			for {
				select {
				case b := <-orders:
					w.Write(b)
					w.(http.Flusher).Flush()
				case <-r.Context().Done():
					return
				}
			}
		case strings.HasSuffix(r.URL.Path, "/BeginCall"):
			n := int(begun.Add(1))
			begins <- n
			if n == 1 {
				answerProto(w, &tetherv1.BeginCallResponse{Call: &tetherv1.ToolCall{CallId: "c-rogue21-a", Tool: "shell"}})
				return
			}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			answerProto(w, &tetherv1.BeginCallResponse{Call: &tetherv1.ToolCall{CallId: "c-rogue21-b", Tool: "shell"}})
		case strings.HasSuffix(r.URL.Path, "/CancelAck"):
			answerProto(w, &tetherv1.CancelAckResponse{})
		case strings.HasSuffix(r.URL.Path, "/EndCall"):
			answerProto(w, &tetherv1.EndCallResponse{})
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	})
	gate := agentsdk.NewToolGate(agentsdk.Dial(url, "rogue21-tool-token"), "rogue21-gate")
	defer gate.Close()
	<-gate.Ready()
	ctx := context.Background()
	a := make(chan error, 1)
	running := make(chan struct{})
	go func() {
		a <- gate.Call(ctx, "a-capability-token", "shell", func(ctx context.Context) error {
			close(running)
			<-ctx.Done() // until its cancel order, which comes after the flood
			return ctx.Err()
		})
	}()
	<-running
	b := make(chan error, 1)
	go func() { b <- gate.Call(ctx, "a-capability-token", "shell", func(context.Context) error { return nil }) }()
	<-begins
	<-begins // the second begin is under way: orders for unknown calls may be held

	var flood []byte
	for i := range 64 {
		flood = append(flood, cancelOrder(t, fmt.Sprintf("c-%d-%s", i, strings.Repeat("x", 64<<10)))...)
	}
	flood = append(flood, cancelOrder(t, "c-rogue21-a")...)
	orders <- flood
	if err := <-a; !errors.Is(err, agentsdk.ErrCancelled) {
		t.Fatalf("call a: %v, want ErrCancelled (its order came after the flood)", err)
	}
	if n := gate.HeldOrders(); n != 0 {
		t.Fatalf("the gate holds %d orders for call ids of 64 KiB", n)
	}
	close(release)
	if err := <-b; err != nil {
		t.Fatalf("call b: %v", err)
	}
}

// cancelOrder is a WatchCancels message for callID in the Connect
// streaming envelope: a flags byte, the length, the message.
func cancelOrder(t *testing.T, callID string) []byte {
	t.Helper()
	m, err := proto.Marshal(&tetherv1.WatchCancelsResponse{CallId: callID, Reason: "flood"})
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m))), m...)
}
