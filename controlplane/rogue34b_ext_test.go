package controlplane_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// floodRogue speaks raw HTTP/2 without a credential, in cleartext or
// over TLS, and reads every frame the server writes, counting its PING
// acknowledgements and RST_STREAMs and noting the end of each stream's
// answer.
type floodRogue struct {
	*h2conn
	rsts  atomic.Int64 // RST_STREAM frames read
	acks  atomic.Int64 // PING acknowledgements read
	ended atomic.Int64 // answers read to their END_STREAM
}

func newFloodRogue(t *testing.T, addr string, tc *tls.Config) *floodRogue {
	t.Helper()
	var c net.Conn
	if tc != nil {
		tlsConn, err := tls.Dial("tcp", addr, tc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tlsConn.Close() })
		c = tlsConn
	} else {
		c = dial(t, addr)
	}
	r := &floodRogue{}
	r.h2conn = newH2ConnOn(t, c, nil, func(_ *h2conn, f http2.Frame) {
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			r.rsts.Add(1)
		case *http2.PingFrame:
			if f.IsAck() {
				r.acks.Add(1)
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				r.ended.Add(1)
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				r.ended.Add(1)
			}
		}
	})
	return r
}

// newFloodRogues opens n floodRogues to addr (over TLS when tc is set).
func newFloodRogues(t *testing.T, addr string, tc *tls.Config, n int) []*floodRogue {
	t.Helper()
	batch := make([]*floodRogue, n)
	for i := range batch {
		batch[i] = newFloodRogue(t, addr, tc)
	}
	return batch
}

// floodEach runs flood on each rogue of batch, each on its own goroutine,
// and returns when all are done; a flood's error fails the test.
func floodEach(t *testing.T, batch []*floodRogue, flood func(r *floodRogue) error) {
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Go(func() {
			if err := flood(r); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestRogue34BAPingFloodCannotGrowTheServersQueue: a client
// without a credential opens connections, in cleartext and over TLS, and
// sends PINGs back to back, 9,900 on each, reading every acknowledgement.
// Go's HTTP/2 server queued each acknowledgement while its writer lagged
// its reader, and the queue kept its largest size for the connection's
// life: some 330 KiB of heap a connection (docs/design.md §11, thirty-first
// pass), on every connection anyone may open. Now the server reads at
// most controlplane.MaxFramesAhead of a connection's frames ahead of its
// writer (until the thirty-fifth pass, no more while 64 of its PINGs were
// unanswered): every acknowledgement is still written,
// and the connection holds a few KiB more than one that sent one PING.
// Judged on the least of up to three measures (anything else the process
// allocates meanwhile only adds to one).
func TestRogue34BAPingFloodCannotGrowTheServersQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the heap measurement; make test and CI run them.")
	}
	files := testserver.NewTLSFiles(t)
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	for _, tc := range []struct {
		name string
		tls  bool
		send func(fr *http2.Framer, i int) error
	}{
		{"PING", false, func(fr *http2.Framer, i int) error { return fr.WritePing(false, [8]byte{byte(i), byte(i >> 8)}) }},
		{"PING over TLS", true, func(fr *http2.Framer, i int) error { return fr.WritePing(false, [8]byte{byte(i), byte(i >> 8)}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
				cfg.Conn.PreAuthTimeout = time.Hour // the flood is not cut short
				cfg.Conn.ControlFrames = -1         // unbounded: the frame budget (rogue38b) would stop the flood before what this test measures
				if tc.tls {
					cfg.TLSCert, cfg.TLSKey = files.ServerCert, files.ServerKey
				}
			})
			addr := strings.TrimPrefix(srv.URL, "http://")
			var tlsConfig *tls.Config
			if tc.tls {
				tlsConfig = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}}
			}
			const conns, flood = 8, 9900
			var rogues []*floodRogue
			// open opens conns connections sending frames each, and returns
			// the heap they hold once every acknowledgement was read.
			open := func(frames int) int64 {
				before := heapAlloc()
				batch := newFloodRogues(t, addr, tlsConfig, conns)
				floodEach(t, batch, func(r *floodRogue) error {
					for i := range frames {
						if err := tc.send(r.fr, i); err != nil {
							return fmt.Errorf("frame %d: %w", i, err)
						}
					}
					return nil
				})
				for _, r := range batch {
					waitCount(t, "acknowledgements", &r.acks, frames, r.closed)
				}
				rogues = append(rogues, batch...)
				return heapAlloc() - before
			}
			const bound = 48 << 10
			if least := leastHeapAFloodedConn(t, conns, flood, bound, open); least > bound {
				t.Errorf("a connection that sent %d %ss holds %d KB more of the heap than one that sent one", flood, tc.name, least>>10)
			}
			for _, r := range rogues {
				_ = r.c.Close()
			}
		})
	}
}

// heapAlloc is the heap in use after two collections.
func heapAlloc() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// leastHeapAFloodedConn is the least, over up to three measures, of the heap
// a connection that sent flood frames holds past one that sent one: open
// opens conns connections, has each send its frames, waits for their
// answers and returns the heap they hold. A measure at or under bound ends
// it (a measure on the loaded machine can catch other tests' garbage).
func leastHeapAFloodedConn(t *testing.T, conns, flood int, bound int64, open func(frames int) int64) int64 {
	t.Helper()
	least := int64(math.MaxInt64)
	for attempt := range 3 {
		quiet := open(1)
		flooded := open(flood)
		perConn := (flooded - quiet) / int64(conns)
		t.Logf("measure %d: %d connections that sent one frame: %d KB; %d that sent %d: %d KB; %d KB a flooded connection",
			attempt+1, conns, quiet>>10, conns, flood, flooded>>10, perConn>>10)
		least = min(least, perConn)
		if least <= bound {
			break
		}
	}
	return least
}
