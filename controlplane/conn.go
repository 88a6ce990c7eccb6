package controlplane

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ConnLimits bound what a client can hold open and how long it can take;
// zero fields take the defaults of DefaultConnLimits. They are network
// timeouts of the server and run on the real clock, not Config.Clock.
//
// Unary calls and the public endpoints get a deadline per request: the
// body must arrive within ReadTimeout and the answer be written within
// WriteTimeout. A stream has no deadline once it is authenticated — a
// session, a watch or a lease Channel may live for days — and is bounded
// instead by HTTP/2 pings (a peer that stops answering them is dropped),
// by MaxStreamsPerConn per connection and by MaxStreamsPerCaller per
// principal.
type ConnLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the body of a unary call (and of any
	// request not yet authenticated).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing the answer of a unary call.
	WriteTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight: an
	// HTTP/1.1 keep-alive connection between requests, an HTTP/2
	// connection with no open stream.
	IdleTimeout time.Duration
	// PingInterval: an HTTP/2 connection silent this long is pinged, and
	// closed when the ping is not answered within PingTimeout.
	PingInterval, PingTimeout time.Duration
	// MaxStreamsPerConn bounds the concurrent streams of one HTTP/2
	// connection.
	MaxStreamsPerConn int
	// MaxConnections bounds the open connections. Past it, HealthReserve
	// more are accepted that may only ask GET /healthz (anything else gets
	// 503, "too many open connections"); past those, a connection is
	// answered 503 (plaintext) or closed (TLS) at once.
	MaxConnections int
	HealthReserve  int
	// MaxStreamsPerCaller bounds the streams one principal holds open at
	// once, over every connection.
	MaxStreamsPerCaller int
	// MaxHeaderBytes bounds a request's headers (HTTP/1.1: 431; HTTP/2:
	// the header list size the server advertises). A stream keeps its
	// headers while it lives, so this times the open streams is what
	// headers may hold; Go's default is a megabyte, far above the 8 KiB
	// of a credential.
	MaxHeaderBytes int
}

// DefaultConnLimits are the limits `tether serve` starts with.
var DefaultConnLimits = ConnLimits{
	ReadHeaderTimeout:   10 * time.Second,
	ReadTimeout:         30 * time.Second,
	WriteTimeout:        30 * time.Second,
	IdleTimeout:         2 * time.Minute,
	PingInterval:        30 * time.Second,
	PingTimeout:         15 * time.Second,
	MaxStreamsPerConn:   250,
	MaxConnections:      10000,
	HealthReserve:       32,
	MaxStreamsPerCaller: 256,
	MaxHeaderBytes:      64 << 10,
}

func (l *ConnLimits) defaults() {
	d := DefaultConnLimits
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&l.ReadHeaderTimeout, d.ReadHeaderTimeout)
	set(&l.ReadTimeout, d.ReadTimeout)
	set(&l.WriteTimeout, d.WriteTimeout)
	set(&l.IdleTimeout, d.IdleTimeout)
	set(&l.PingInterval, d.PingInterval)
	set(&l.PingTimeout, d.PingTimeout)
	if l.MaxStreamsPerConn == 0 {
		l.MaxStreamsPerConn = d.MaxStreamsPerConn
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.HealthReserve == 0 {
		l.HealthReserve = d.HealthReserve
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MaxStreamsPerCaller == 0 {
		l.MaxStreamsPerCaller = d.MaxStreamsPerCaller
	}
}

// streamingProcedures are the paths of every streaming RPC of the tether
// services, from the compiled descriptors.
var streamingProcedures = sync.OnceValue(func() map[string]bool {
	out := map[string]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				if m.IsStreamingClient() || m.IsStreamingServer() {
					out["/"+string(svc.FullName())+"/"+string(m.Name())] = true
				}
			}
		}
		return true
	})
	return out
})

// withDeadlines gives every request a read and a write deadline from its
// start; streamsUnbounded lifts them for an admitted stream.
func withDeadlines(limits ConnLimits, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		_ = rc.SetReadDeadline(now.Add(limits.ReadTimeout))
		_ = rc.SetWriteDeadline(now.Add(limits.WriteTimeout))
		next.ServeHTTP(w, r)
	})
}

// streamsUnbounded lifts the request deadlines of a streaming RPC. It sits
// behind the auth Gate, so only an authenticated, authorised stream (which
// then holds one of its caller's MaxStreamsPerCaller) lives past them.
func streamsUnbounded(next http.Handler) http.Handler {
	streaming := streamingProcedures()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if streaming[r.URL.Path] {
			rc := http.NewResponseController(w)
			_ = rc.SetReadDeadline(time.Time{})
			_ = rc.SetWriteDeadline(time.Time{})
		}
		next.ServeHTTP(w, r)
	})
}

// connLimiter counts open connections. Accept hands out every connection
// up to max, then up to reserve more marked for health checks only, and
// refuses the rest itself.
type connLimiter struct {
	net.Listener
	max, reserve int
	plaintext    bool // a refusal may be written as HTTP/1.1
	open         atomic.Int64
	refused      atomic.Uint64
}

// limitedConn is a counted connection; closing it frees its place.
//
// On a plaintext listener its reads are buffered: Go's HTTP/2 server
// reads each frame's 9-byte header and then its payload straight from the
// connection, two system calls a frame (a unary call is a HEADERS and a
// DATA frame at least), where one read usually brings in everything the
// peer has sent. (Under TLS the frames are read from the TLS connection's
// own buffer of decrypted records, so r is nil there.)
type limitedConn struct {
	net.Conn
	r          *bufio.Reader // nil: unbuffered
	healthOnly bool
	once       sync.Once
	l          *connLimiter
}

// connReadBuffer is each connection's read buffer: room for a unary call's
// frames (a credential's HEADERS, a small DATA) in one read.
const connReadBuffer = 4 << 10

func (c *limitedConn) Read(p []byte) (int, error) {
	if c.r == nil {
		return c.Conn.Read(p)
	}
	return c.r.Read(p)
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		if n <= int64(l.max+l.reserve) {
			lc := &limitedConn{Conn: c, healthOnly: n > int64(l.max), l: l}
			if l.plaintext {
				lc.r = bufio.NewReaderSize(c, connReadBuffer)
			}
			return lc, nil
		}
		l.open.Add(-1)
		l.refused.Add(1)
		go l.refuse(c)
	}
}

// refuse answers a connection past every place: a plain 503 on a
// plaintext listener (written without reading the request), then close.
func (l *connLimiter) refuse(c net.Conn) {
	defer c.Close()
	if !l.plaintext {
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, overloadResponse)
}

const overloadBody = "tether: too many open connections; retry later\n"

var overloadResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
	strconv.Itoa(len(overloadBody)) + "\r\n\r\n" + overloadBody

type healthOnlyKey struct{}

// connContext marks the requests of a health-only connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok && lc.healthOnly {
		return context.WithValue(ctx, healthOnlyKey{}, true)
	}
	return ctx
}

// healthOnly answers every request of a connection accepted past
// MaxConnections with 503, except GET /healthz: an orchestrator's probe
// still learns the server is alive while it is full.
func healthOnly(max int, next http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(healthOnlyKey{}) == nil || (r.Method == http.MethodGet && r.URL.Path == "/healthz") {
			next.ServeHTTP(w, r)
			return
		}
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		w.Header().Set("Retry-After", "1")
		err := fmt.Errorf("too many open connections (the server's limit is %d); retry later", max)
		if errw.IsSupported(r) {
			_ = errw.Write(w, r, connect.NewError(connect.CodeUnavailable, err))
			return
		}
		http.Error(w, "tether: "+err.Error(), http.StatusServiceUnavailable)
	})
}

// gzipName is the compression Connect negotiates as "gzip".
const gzipName = "gzip"

// boundedGzip replaces Connect's gzip decompressor with one that stops
// inflating one byte past the message limit. Connect reads limit+1 bytes to
// learn a message is too large and then drains the rest to report its
// size; with the stock decompressor that drain inflates a gzip bomb in full
// (1 MB of gzip is 1 GiB). This one fails the drain at once, so the
// refusal (resource_exhausted, naming the limit) costs at most limit+1
// inflated bytes.
func boundedGzip(limit int) connect.HandlerOption {
	return connect.WithCompression(gzipName,
		func() connect.Decompressor { return &boundedGzipReader{limit: int64(limit)} },
		func() connect.Compressor { return gzip.NewWriter(nil) },
	)
}

type boundedGzipReader struct {
	gz    gzip.Reader
	limit int64
	left  int64
}

// errInflatedTooLarge ends a decompression past the limit.
var errInflatedTooLarge = errors.New("the decompressed message is larger than the limit; not inflating the rest")

func (b *boundedGzipReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errInflatedTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.gz.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedGzipReader) Reset(r io.Reader) error {
	b.left = b.limit + 1
	return b.gz.Reset(r)
}

func (b *boundedGzipReader) Close() error { return b.gz.Close() }

// OpenConnections is how many connections the server holds open now
// (health-only ones included); 0 before Run.
func (s *Server) OpenConnections() int {
	conns := s.conns.Load()
	if conns == nil {
		return 0
	}
	return int(conns.open.Load())
}

// OpenStreams is how many streams principal (e.g. "agent:n_…") holds open
// on this server now.
func (s *Server) OpenStreams(principal string) int { return s.authn.OpenStreams(principal) }

// boundBodies bounds what an authenticated request's body can make the
// server read. Connect, refusing a message past the limit, reads on to
// the end of it to report its size: a unary body is read to its end,
// however long, and an enveloped message (streams, gRPC) for as many bytes
// as its 5-byte prefix declares — up to 4 GiB. Here a unary body fails one
// byte past the limit, and an envelope declaring more than the limit fails
// right after its prefix, so the refusal (resource_exhausted, naming the
// limit) costs at most the limit.
func boundBodies(limit int, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			ct := r.Header.Get("Content-Type")
			if strings.HasPrefix(ct, "application/connect+") || strings.HasPrefix(ct, "application/grpc") {
				r.Body = &envelopeGuard{ReadCloser: r.Body, limit: int64(limit)}
			} else {
				r.Body = http.MaxBytesReader(w, r.Body, int64(limit)+1)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// envelopeGuard follows the envelopes of a body as they are read and fails
// the read after a prefix that declares a message larger than limit.
type envelopeGuard struct {
	io.ReadCloser
	limit  int64
	prefix [5]byte
	seen   int   // bytes of the current prefix read so far
	left   int64 // bytes of the current message still to come
	err    error
}

func (g *envelopeGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.ReadCloser.Read(p)
	for i := 0; i < n; {
		if g.left > 0 {
			k := min(int64(n-i), g.left)
			g.left -= k
			i += int(k)
			continue
		}
		g.prefix[g.seen] = p[i]
		g.seen++
		i++
		if g.seen < len(g.prefix) {
			continue
		}
		g.seen = 0
		g.left = int64(binary.BigEndian.Uint32(g.prefix[1:]))
		if g.left > g.limit {
			g.err = fmt.Errorf("a message of %d bytes, larger than the limit of %d bytes; not reading it", g.left, g.limit)
			return i, nil // the prefix, so that the reader learns the size
		}
	}
	return n, err
}
