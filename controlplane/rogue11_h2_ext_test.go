package controlplane_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// h2conn is a raw HTTP/2 client connection of a rogue's own: it sends
// the preface and settings, and reads what the server sends on a goroutine
// (handing each frame to onFrame) until the connection closes. Writes
// from the test and from onFrame go through mu.
type h2conn struct {
	c      net.Conn
	mu     sync.Mutex // the framer's writes, when onFrame writes too
	fr     *http2.Framer
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	next   uint32
	closed chan struct{}
}

func newH2Conn(t *testing.T, addr string, settings []http2.Setting, onFrame func(*h2conn, http2.Frame)) *h2conn {
	t.Helper()
	return newH2ConnOn(t, dial(t, addr), settings, onFrame)
}

// newH2ConnOn is newH2Conn on a connection already open (over TLS, say).
func newH2ConnOn(t *testing.T, c net.Conn, settings []http2.Setting, onFrame func(*h2conn, http2.Frame)) *h2conn {
	t.Helper()
	r := &h2conn{c: c, closed: make(chan struct{}), next: 1}
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	r.fr = http2.NewFramer(c, c)
	r.enc = hpack.NewEncoder(&r.hbuf)
	if err := r.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	rd := http2.NewFramer(io.Discard, c)
	go func() {
		defer close(r.closed)
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				return
			}
			onFrame(r, f)
		}
	}()
	return r
}

// writeHeaders opens a stream calling procedure with cred (mu held).
func (r *h2conn) writeHeaders(procedure, contentType, cred string, end bool) (uint32, error) {
	r.hbuf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "tether"}, {":path", procedure},
		{"content-type", contentType}, {"authorization", "Bearer " + cred}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	id := r.next
	r.next += 2
	return id, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: end})
}

func (r *h2conn) isClosed() bool {
	select {
	case <-r.closed:
		return true
	default:
		return false
	}
}

// h2rogue is an authenticated agent speaking raw HTTP/2 frames on a
// connection of its own; what the server sends back is counted.
type h2rogue struct {
	*h2conn
	frames atomic.Int64
	goaway atomic.Bool
}

func newH2Rogue(t *testing.T, addr string) *h2rogue {
	t.Helper()
	r := &h2rogue{}
	r.h2conn = newH2Conn(t, addr, nil, func(_ *h2conn, f http2.Frame) {
		r.frames.Add(1)
		if _, ok := f.(*http2.GoAwayFrame); ok {
			r.goaway.Store(true)
		}
	})
	return r
}

// headers opens a stream calling GetNode with cred, without ending it.
func (r *h2rogue) headers(cred string, end bool) (uint32, error) {
	return r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", cred, end)
}

// serverLoad is the process's goroutines and live heap after a GC.
func serverLoad() (int, uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return runtime.NumGoroutine(), m.HeapInuse
}

// TestAnAuthenticatedAgentsHTTP2FramesCostBoundedServerResources: an
// authenticated rogue agent speaks raw HTTP/2 on connections of its own —
// a PING flood, a SETTINGS flood, rapid reset (HEADERS of a call then
// RST_STREAM, twenty thousand times), streams opened and left half-closed,
// WINDOW_UPDATE and empty DATA games — and the process is measured: its
// goroutines while each flood runs stay within the connection's stream
// bound (MaxStreamsPerConn) of the baseline, its heap after a GC grows by
// less than a bounded amount, every goroutine the connection held is
// given back when it closes, and another agent's call is served
// throughout. The rapid-reset streams are calls: each is charged to the
// rogue's lineage, which is refused once its budget is spent. Go's server
// answers the control frames themselves without closing the connection
// (bar its queue of unsent control frames); docs/design.md §11.
func TestAnAuthenticatedAgentsHTTP2FramesCostBoundedServerResources(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst = 1, 1000 // no budget refills
		cfg.Conn.ControlFrames = -1            // unbounded: the frame budget (rogue38b) would stop the flood before what this test measures
	})
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	rogueC := srv.Clients(root.Credential)
	other := register(t, admin, "other")
	otherC := srv.Clients(other.Credential)
	addr := hostOf(t, srv.URL)
	g0, h0 := serverLoad()
	// What the server's connections hold, for their goroutines' return:
	// the process's count moves by itself on etcd (see ConnGoroutines).
	c0 := srv.ConnGoroutines()
	perConn := controlplane.DefaultConnLimits.MaxStreamsPerConn
	const heapBound = 64 << 20

	phase := func(name string, n int, send func(r *h2rogue, i int) error) {
		t.Helper()
		r := newH2Rogue(t, addr)
		peakG, sent := 0, 0
		for i := 0; i < n && !r.isClosed(); i++ {
			if err := send(r, i); err != nil {
				break
			}
			sent++
			if i%250 == 0 {
				peakG = max(peakG, runtime.NumGoroutine())
			}
		}
		if err := whoAmI(otherC); err != nil {
			t.Errorf("%s: another agent's call: %v", name, err)
		}
		g, h := serverLoad()
		peakG = max(peakG, g)
		t.Logf("%s: %d/%d frames sent, closed by the server: %v, peak %d goroutines (baseline %d), heap %d KiB after GC (baseline %d KiB)", name, sent, n, r.isClosed(), peakG, g0, h>>10, h0>>10)
		if peakG > g0+2*perConn+50 {
			t.Errorf("%s: %d goroutines at the peak, baseline %d: more than the connection's %d streams account for", name, peakG, g0, perConn)
		}
		if h > h0+heapBound {
			t.Errorf("%s: heap %d KiB after GC, baseline %d KiB", name, h>>10, h0>>10)
		}
		r.c.Close()
		<-r.closed
		testserver.WaitFor(t, 20*time.Second, name+": the connection's goroutines to be given back", func() bool {
			return srv.ConnGoroutines() <= c0+10
		})
	}
	phase("PING flood", 50000, func(r *h2rogue, i int) error { return r.fr.WritePing(false, [8]byte{byte(i)}) })
	phase("SETTINGS flood", 50000, func(r *h2rogue, i int) error { return r.fr.WriteSettings() })
	phase("WINDOW_UPDATE games", 50000, func(r *h2rogue, i int) error { return r.fr.WriteWindowUpdate(0, 1) })
	phase("streams left half-closed", 5000, func(r *h2rogue, i int) error {
		_, err := r.headers(root.Credential, false)
		return err
	})
	phase("empty DATA frames", 50000, func(r *h2rogue, i int) error {
		if i == 0 {
			if _, err := r.headers(root.Credential, false); err != nil {
				return err
			}
		}
		return r.fr.WriteData(1, false, nil)
	})
	// A stream reset before the server starts its handler is dropped
	// unjudged (Go's rapid-reset defence queues handlers past the stream
	// bound), so on a loaded machine a round may reach fewer handlers than
	// the lineage's burst: the flood is repeated, and a lineage that is
	// never refused after ten rounds (200,000 resets, each reached handler
	// charged) fails.
	var err error
	for round := 1; round <= 10; round++ {
		phase(fmt.Sprintf("rapid reset, round %d", round), 20000, func(r *h2rogue, i int) error {
			id, err := r.headers(root.Credential, false)
			if err != nil {
				return err
			}
			return r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		})
		_, err = rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			break
		}
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("the rogue's own call after ten rounds of twenty thousand reset calls: %v, want resource_exhausted (each was charged to its lineage)", err)
	}
	if err := whoAmI(otherC); err != nil {
		t.Errorf("another agent's call after the floods: %v", err)
	}
}
