package controlplane_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestRogue41ADataFramesOnARefusedStreamAreChargedAsFrames: a client
// without a credential grants the server no flow-control window
// (SETTINGS_INITIAL_WINDOW_SIZE 0), opens a call's stream without ending
// it — refused from its headers (unauthenticated), which earns the
// connection FramesPerRequest frames, its refusal's body held unwritten —
// and sends DATA frames of one byte on that stream, a PING after every
// hundred. The frame guard counted a DATA frame carrying a payload on a
// stream the peer opened and neither side had ended as a request's body,
// free (its bytes charged by their size), but this body is nobody's: the
// server reads and drops it, giving back the connection's window as it
// goes, the stream's window (64 KiB: 65,536 frames of a byte) never
// taken. A refusal earned its sender some 65,000 frames of the server's
// work, charged to no budget, eight such streams at once on each
// connection anyone may open. Now a stream's DATA frames are free only
// while its body is being read: past controlplane.DataFramesPerWindowUpdate
// since the server last gave the stream window (a WINDOW_UPDATE on it,
// sent when its handler has read some 4 KiB) each costs a frame, given
// back with that window. With the clock stopped the rogue's connection is
// read no further once it has spent its budget: at most the budget's
// PINGs are answered.
func TestRogue41ADataFramesOnARefusedStreamAreChargedAsFrames(t *testing.T) {
	const flood, every = 5000, 100
	limits := controlplane.DefaultConnLimits
	// The frames the rogue's connection may read with the clock stopped:
	// the budget, what its refusal earned, the stream's free DATA frames,
	// its HEADERS and the server's SETTINGS, and the frame that spent it.
	bound := int64(limits.ControlFrames+controlplane.FramesPerRequest+controlplane.DataFramesPerWindowUpdate+8)/every + 1
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	before := srv.ThrottledConnections()
	var acks, refusals atomic.Int64
	r := newH2ConnOn(t, dial(t, hostOf(t, srv.URL)), []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}},
		func(_ *h2conn, f http2.Frame) {
			switch f := f.(type) {
			case *http2.PingFrame:
				if f.IsAck() {
					acks.Add(1)
				}
			case *http2.HeadersFrame:
				if f.StreamID == 1 {
					refusals.Add(1)
				}
			}
		})
	r.mu.Lock()
	id, err := r.writeHeaders(tetherv1connect.AuthServiceWhoAmIProcedure, "application/proto", "", false)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "the call's refusal to begin", func() bool { return refusals.Load() >= 1 })
	var sendErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.mu.Lock()
		defer r.mu.Unlock()
		for i := range flood {
			if sendErr = r.fr.WriteData(id, false, []byte{'x'}); sendErr != nil {
				return
			}
			if (i+1)%every == 0 {
				if sendErr = r.fr.WritePing(false, [8]byte{byte(i >> 8), byte(i)}); sendErr != nil {
					return
				}
			}
		}
	}()
	// Either every PING is answered (the hole), or the connection is
	// throttled first.
	testserver.WaitFor(t, closeWait, "the rogue's PINGs answered or its connection throttled", func() bool {
		return acks.Load() >= flood/every || srv.ThrottledConnections() > before
	})
	if n := acks.Load(); n > bound {
		t.Fatalf("%d of the %d PINGs among the rogue's %d one-byte DATA frames on its refused stream answered with the clock stopped (every frame before them read), want at most %d", n, flood/every, flood, bound)
	}
	if n := srv.ThrottledConnections(); n != before+1 {
		t.Fatalf("%d connections throttled, want %d (the rogue's alone)", n, before+1)
	}
	_ = r.c.Close()
	clk.Advance(controlplane.MaxThrottled + time.Second)
	testserver.WaitFor(t, closeWait, "the closed connection to leave the throttled count", func() bool {
		return srv.ThrottledConnections() == before
	})
	<-done
	_ = sendErr // the flood fails once the connection is closed
}

// TestRogue41AAnHonestStreamOfSmallMessagesIsAnswered: an agent renews
// its lease over a Channel stream, 2,000 renews sent back to back, each a
// DATA frame or two of a few dozen bytes, far more than
// controlplane.DataFramesPerWindowUpdate in flight at once, with the clock
// stopped (nothing refills the frame budget by time). Its stream's DATA
// frames are a body its handler reads: the server gives the stream window
// as it reads, each window making its next DataFramesPerWindowUpdate
// frames free and giving back any charged since, so every renew is
// answered (as before the forty-first pass: a regression guard for the
// rogue41a fix).
func TestRogue41AAnHonestStreamOfSmallMessagesIsAnswered(t *testing.T) {
	const renews = 2000
	renewsAllAnswered(t, newLeaseWorld(t), renews)
}

// renewsAllAnswered has w's worker ACK a lease and send renews renews
// back to back over one Channel stream, reading every answer, and
// fails unless all are answered. It returns the stream, still open (closed
// at the test's cleanup), and the lease.
func renewsAllAnswered(t *testing.T, w *leaseWorld, renews int) (*connect.BidiStreamForClient[tetherv1.ChannelRequest, tetherv1.ChannelResponse], *tetherv1.Lease) {
	t.Helper()
	l := w.offer(t, w.job(), w.w1, 10*time.Minute)
	l, _ = unary{w.w1C}.send(t, ack(l))
	stream := w.w1C.Lease.Channel(context.Background())
	t.Cleanup(func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() })
	var answered atomic.Int64
	var sendErr, recvErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range renews {
			if sendErr = stream.Send(renew(l, uint64(i+1))); sendErr != nil {
				return
			}
		}
	})
	wg.Go(func() {
		for range renews {
			if _, recvErr = stream.Receive(); recvErr != nil {
				return
			}
			answered.Add(1)
		}
	})
	// With the clock stopped a throttled connection is read again only
	// once the stream's window gives its frames back.
	testserver.WaitFor(t, closeWait, "every renew answered", func() bool {
		return answered.Load() == int64(renews)
	})
	wg.Wait()
	if sendErr != nil || recvErr != nil {
		t.Fatalf("the stream: send %v, receive %v", sendErr, recvErr)
	}
	return stream, l
}
