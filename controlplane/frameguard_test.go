package controlplane

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/internal/clock"
)

// TestFrameGuardKeepsTheRequestsTLSState: HTTP/2 over TLS is served
// through the guard as cleartext HTTP/2 over the TLS connection; a
// request still sees its TLS state (the console marks its cookie Secure
// by it).
func TestFrameGuardKeepsTheRequestsTLSState(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Unix(0, 0), NotAfter: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	sawTLS := make(chan bool, 1)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sawTLS <- r.TLS != nil && r.ProtoMajor == 2
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	srv.Protocols = p
	if err := guardHTTP2(srv, frameLimits{}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("served %s, want HTTP/2", resp.Proto)
	}
	if !<-sawTLS {
		t.Fatal("the request over HTTP/2 and TLS had no TLS state")
	}
}

// TestFrameScannerCutsAtFrameEndsOutsideHeaderBlocks: the scanner
// follows frames whatever the reads' boundaries, cuts at the end of the
// frame that fills its room, and never inside a header block (no other
// frame may come between a HEADERS frame and its CONTINUATIONs).
func TestFrameScannerCutsAtFrameEndsOutsideHeaderBlocks(t *testing.T) {
	var wire bytes.Buffer
	fr := http2.NewFramer(&wire, nil)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	for i := range 5 {
		_ = fr.WritePing(false, [8]byte{byte(i)})
		_ = fr.WriteData(1, false, make([]byte, i*7))
	}
	// frames 12-14: a header block in three frames.
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x82}})
	_ = fr.WriteContinuation(3, false, []byte{0x86})
	_ = fr.WriteContinuation(3, true, []byte{0x84})
	_ = fr.WritePing(false, [8]byte{})
	all := wire.Bytes()
	cuts := func(chunk, limit int) []int {
		var s frameScanner
		var at []int
		for pos := 0; pos < len(all); {
			end := min(pos+chunk, len(all))
			k, due := s.scan(all[pos:end], limit)
			pos += k
			if due {
				at = append(at, pos)
			}
		}
		return at
	}
	// Cut after every frame: eleven, the block's three at its end, the
	// last; with room for four, after frames 4, 8 and 14 (the block's
	// end, not 12 inside it).
	var ends []int
	var s frameScanner
	for pos := 0; pos < len(all); {
		k, _ := s.scan(all[pos:], 1)
		pos += k
		ends = append(ends, pos)
	}
	if len(ends) != 13 {
		t.Fatalf("cut after every frame: %d cuts, want 13", len(ends))
	}
	want := []int{ends[3], ends[7], ends[11]}
	for _, chunk := range []int{1, 5, 9, 17, len(all)} {
		if got := cuts(chunk, 4); !slices.Equal(got, want) {
			t.Errorf("reads of %d bytes: cuts at %v, want %v", chunk, got, want)
		}
	}
}

// TestAckFilterTakesOutOnlyTheGuardsAcknowledgements: whatever the
// writes' boundaries, the filter takes out the acknowledgements carrying
// the guard's cookie and writes every other byte, in order.
func TestAckFilterTakesOutOnlyTheGuardsAcknowledgements(t *testing.T) {
	cookie := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	var wire, want bytes.Buffer
	fr := http2.NewFramer(&wire, nil)
	kept := http2.NewFramer(&want, nil)
	both := func(write func(*http2.Framer) error) {
		_ = write(fr)
		_ = write(kept)
	}
	both(func(f *http2.Framer) error { return f.WriteSettings() })
	for i := range 6 {
		_ = fr.WritePing(true, cookie) // the guard's: taken out
		both(func(f *http2.Framer) error { return f.WritePing(true, [8]byte{byte(i)}) })
		both(func(f *http2.Framer) error { return f.WritePing(false, cookie) }) // not an ACK
		both(func(f *http2.Framer) error { return f.WriteData(1, false, make([]byte, 8)) })
		both(func(f *http2.Framer) error { return f.WriteRSTStream(uint32(2*i+1), http2.ErrCodeStreamClosed) })
		both(func(f *http2.Framer) error { return f.WriteData(1, false, nil) })
	}
	_ = fr.WritePing(true, cookie)
	all := wire.Bytes()
	for _, chunk := range []int{1, 2, 3, 7, 9, 10, 16, 17, 18, 100, len(all)} {
		f := ackFilter{cookie: cookie}
		var got bytes.Buffer
		acks := 0
		for pos := 0; pos < len(all); pos += chunk {
			out, n := f.filter(all[pos:min(pos+chunk, len(all))])
			got.Write(out)
			acks += n
		}
		if acks != 7 || !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("writes of %d bytes: %d acknowledgements taken out (want 7), %d bytes written (want %d), equal: %v",
				chunk, acks, got.Len(), want.Len(), bytes.Equal(got.Bytes(), want.Bytes()))
		}
	}
}

// TestLimitedOfSeesThroughTheGuard: Go's HTTP/2 server reports a
// connection's state with the connection it serves, now the guard; the
// limiter still finds its connection under it (an unauthenticated
// connection's request in flight gets its grace), in cleartext and over TLS.
func TestLimitedOfSeesThroughTheGuard(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	lc := &limitedConn{Conn: a}
	if got := limitedOf(newFrameGuard(lc, frameLimits{})); got != lc {
		t.Fatal("the cleartext guard hid its connection")
	}
	tc := tls.Server(lc, &tls.Config{})
	if got := limitedOf(&tlsFrameGuard{newFrameGuard(tc, frameLimits{}), tc}); got != lc {
		t.Fatal("the TLS guard hid its connection")
	}
}

// TestRogue41AFrameGuardGivesAStreamsChargedDataFramesBackWithItsWindow:
// a stream the peer opened sends DataFramesPerWindowUpdate DATA frames
// carrying a payload free, then one each from the connection's frame
// budget; a WINDOW_UPDATE the server writes on the stream (its handler
// read its body) gives the charged frames back and frees its next
// DataFramesPerWindowUpdate, while a connection's WINDOW_UPDATE (stream
// 0) gives nothing back.
func TestRogue41AFrameGuardGivesAStreamsChargedDataFramesBackWithItsWindow(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go func() { _, _ = io.Copy(io.Discard, b) }()
	const burst, over = 128, 100
	g := newFrameGuard(a, frameLimits{burst: burst, clock: clock.NewManual(time.Unix(0, 0)), throttled: new(atomic.Int64)})
	credit := func() float64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.budget.credit
	}
	frame := func(typ, flags byte, stream uint32, length int) *[9]byte {
		return &[9]byte{byte(length >> 16), byte(length >> 8), byte(length), typ, flags, byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	}
	g.charge(frame(frameHeaders, flagEndHeaders, 1, 10))
	data := func(n int) {
		for range n {
			g.charge(frame(frameData, 0, 1, 1))
		}
	}
	data(DataFramesPerWindowUpdate)
	if got := credit(); got != burst-1 {
		t.Fatalf("credit %v after the stream's HEADERS and %d free DATA frames, want %d", got, DataFramesPerWindowUpdate, burst-1)
	}
	data(over)
	if got := credit(); got != burst-1-over {
		t.Fatalf("credit %v after %d DATA frames past the free ones, want %d", got, over, burst-1-over)
	}
	write := func(stream uint32) {
		var buf bytes.Buffer
		if err := http2.NewFramer(&buf, nil).WriteWindowUpdate(stream, 4096); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Write(buf.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	if got := credit(); got != burst-1-over {
		t.Fatalf("credit %v after the connection's window update, want %d (nothing given back)", got, burst-1-over)
	}
	write(1)
	if got := credit(); got != burst-1 {
		t.Fatalf("credit %v after the stream's window update, want %d (its charged frames given back)", got, burst-1)
	}
	data(DataFramesPerWindowUpdate)
	if got := credit(); got != burst-1 {
		t.Fatalf("credit %v after %d more DATA frames following the stream's window, want %d (free again)", got, DataFramesPerWindowUpdate, burst-1)
	}
}

// TestRogue42AAckFilterEarnsForSmallDataFramesByTheirBytes: the DATA
// frames the server writes earn their peer's frame budget the window
// updates they draw: one for a frame of EarnedDataBytes or more (as
// before), and one for each EarnedDataBytes of smaller frames together,
// which earned nothing until the forty-second pass. No frame earns more
// than one, and empty ones earn nothing.
func TestRogue42AAckFilterEarnsForSmallDataFramesByTheirBytes(t *testing.T) {
	earned := func(frames ...int) int {
		var wire bytes.Buffer
		fr := http2.NewFramer(&wire, nil)
		for _, n := range frames {
			_ = fr.WriteData(1, false, make([]byte, n))
		}
		f := ackFilter{}
		f.filter(wire.Bytes())
		return f.earned
	}
	small := make([]int, 4*EarnedDataBytes/64) // 4 KiB in frames of 64 bytes
	for i := range small {
		small[i] = 64
	}
	for _, c := range []struct {
		what   string
		frames []int
		want   int
	}{
		{"4 KiB in frames of 64 bytes", small, 4},
		{"a frame of a KiB", []int{EarnedDataBytes}, 1},
		{"a frame of 16 KiB", []int{MaxFrameBytes}, 1},
		{"a KiB less a byte, then a byte", []int{EarnedDataBytes - 1, 1}, 1},
		{"a KiB less a byte", []int{EarnedDataBytes - 1}, 0},
		{"empty frames", []int{0, 0, 0}, 0},
	} {
		if got := earned(c.frames...); got != c.want {
			t.Errorf("%s earned %d, want %d", c.what, got, c.want)
		}
	}
}
