package controlplane

import (
	"bufio"
	"compress/gzip"
	"container/list"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tetherhq/tether/controlplane/auth"
)

// ConnLimits bound what a client can hold open and how long it can take;
// zero fields take the defaults of DefaultConnLimits. They are network
// timeouts of the server and run on the real clock, not Config.Clock.
//
// Unary calls and the public endpoints get a deadline per request: the
// body must arrive within ReadTimeout and the answer be written within
// WriteTimeout. A stream has no deadline once it is authenticated — a
// session, a watch or a lease Channel may live for days — and is bounded
// instead by WriteTimeout per write (a client that stops taking its
// messages loses the stream), by HTTP/2 pings (a peer that stops
// answering them is dropped), by MaxStreamsPerConn per connection, by
// MaxStreamsPerCaller per principal and by MaxStreamsPerLineage per agent
// lineage.
type ConnLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the body of a unary call (and of any
	// request not yet authenticated).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing the answer of a unary call, and each
	// write of a stream's messages: a stream whose client takes none of
	// what the server writes for this long (it grants no flow-control
	// window, or does not read its connection) is reset, and an HTTP/2
	// connection none of whose bytes its peer takes this long is closed.
	WriteTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight: an
	// HTTP/1.1 keep-alive connection between requests, an HTTP/2
	// connection with no open stream; and a connection bound to a caller
	// that carried no admitted request for this long, whatever else it
	// carried (idleCheck, gracefully: a GOAWAY first).
	IdleTimeout time.Duration
	// PingInterval: an HTTP/2 connection silent this long is pinged, and
	// closed when the ping is not answered within PingTimeout.
	PingInterval, PingTimeout time.Duration
	// MaxStreamsPerConn bounds the concurrent streams of one HTTP/2
	// connection.
	MaxStreamsPerConn int
	// MaxConnections bounds the open connections. A connection is
	// unauthenticated until a request on it is admitted; at the cap, the
	// oldest unauthenticated connection of the new one's source address
	// (an IPv4 address, an IPv6 /64), or the oldest of all when that
	// source has none, is closed to make room for a new one. Only when every connection is authenticated are HealthReserve
	// more accepted that may only ask GET /healthz (anything else gets 503,
	// "too many open connections"), the oldest of them giving way to a new
	// one in turn.
	MaxConnections int
	HealthReserve  int
	// PreAuthTimeout closes a connection that has carried no admitted
	// request this long after it was accepted (one with a request in
	// flight then, WriteTimeout later).
	PreAuthTimeout time.Duration
	// MaxConnectionsPerLineage bounds the connections one caller holds:
	// an agent's lineage (its root and every descendant together), an
	// operator, a tool server. A connection counts against every caller
	// whose requests it carried. Past it, an agent node that bound no
	// connection still binds ConnectionReserve. Zero: half of
	// MaxConnections.
	MaxConnectionsPerLineage int
	// OperatorReserve are the connections of MaxConnections agents cannot
	// hold: agents together hold at most MaxConnections-OperatorReserve,
	// the rest are kept for operators and tool servers. Zero: a hundredth
	// of MaxConnections, at least 1.
	OperatorReserve int
	// MaxStreamsPerCaller bounds the streams one principal holds open at
	// once, over every connection; and, counted apart, its calls admitted
	// from their headers whose bodies have not all arrived, and its unary
	// calls' answers being written (answersBounded).
	MaxStreamsPerCaller int
	// MaxStreamsPerLineage bounds the streams an agent's lineage (its root
	// and every descendant together) holds open at once, over every
	// connection; past it each node still opens SignalStreamReserve signal
	// streams and StreamReserve others of its own. Zero:
	// MaxConnectionsPerLineage — a stream on each connection the lineage
	// may hold, beside its nodes' reserves — and at least
	// MaxStreamsPerCaller. It bounds too, counted apart, the lineage's
	// calls admitted from their headers whose bodies have not all arrived,
	// and its unary calls' answers being written, each node BodyReserve
	// more of each of its own.
	MaxStreamsPerLineage int
	// fileLimited is the MaxConnections asked for, when the open-file
	// limit lowered it (fitFileLimit); New logs it.
	fileLimited int
	// ControlFrames bounds the HTTP/2 frames of a connection that carry
	// no request's work — PING, SETTINGS, WINDOW_UPDATE, PRIORITY,
	// RST_STREAM, empty DATA, DATA on a stream already ended or reset,
	// HEADERS and CONTINUATION frames — that its
	// peer may send ahead of what earned them: each request on the
	// connection the auth Gate judges (admitted, or refused and charged
	// to the budget of requests without a valid credential or of
	// refusals) earns FramesPerRequest, each PING and SETTINGS the
	// server sends one, each DATA frame of the server's answers of a KiB or
	// more one, and ControlFrameRate a second, up to ControlFrames. A
	// connection past it is read no further until it earns more (slowed,
	// not closed: its peer alone sent those frames, and an honest client
	// misjudged loses time, not calls). Go's HTTP/2 server answers such
	// frames for free for as long as a connection lives, a frame's CPU each
	// (thirty-eighth pass). Negative: unbounded.
	ControlFrames int
	// ControlFrameRate is how many frames ControlFrames earns a second.
	ControlFrameRate float64
	// MaxHeaderBytes bounds a request's headers (HTTP/1.1: 431; HTTP/2:
	// the header list size the server advertises); Go's default is a
	// megabyte, far above the 8 KiB of a credential. A stream keeps its
	// headers while it lives, and is refused when they are past
	// MaxStreamHeaderBytes or MaxStreamHeaderFields, whatever this says.
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
	PreAuthTimeout:      10 * time.Second,
	MaxStreamsPerCaller: 256,
	MaxHeaderBytes:      64 << 10,
	ControlFrames:       128,
	ControlFrameRate:    2,
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
	l.fitFileLimit(openFileLimit())
	set(&l.PreAuthTimeout, d.PreAuthTimeout)
	if l.MaxConnectionsPerLineage == 0 {
		l.MaxConnectionsPerLineage = max(1, l.MaxConnections/2)
	}
	if l.OperatorReserve == 0 {
		l.OperatorReserve = max(1, l.MaxConnections/100)
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.ControlFrames == 0 {
		l.ControlFrames = d.ControlFrames
	}
	if l.ControlFrameRate == 0 {
		l.ControlFrameRate = d.ControlFrameRate
	}
	if l.MaxStreamsPerCaller == 0 {
		l.MaxStreamsPerCaller = d.MaxStreamsPerCaller
	}
	if l.MaxStreamsPerLineage == 0 {
		l.MaxStreamsPerLineage = max(l.MaxConnectionsPerLineage, l.MaxStreamsPerCaller)
	}
}

// SignalStreamReserve is how many signal streams (Session, WatchSignals)
// each agent node may open beyond its lineage's share of open streams
// (ConnLimits.MaxStreamsPerLineage): a member of the lineage holding the
// share cannot keep a sibling from hearing its stop. Two, so that a node
// reconnecting opens its new stream before the server has noticed the old
// one broke; a rogue's children each bring two, and each was a spawn its
// lineage paid for.
const SignalStreamReserve = 2

// StreamReserve is how many streams of other kinds (a lease Channel, a
// watch) each agent node may open beyond its lineage's share, beside its
// SignalStreamReserve: a member of the lineage holding the share cannot
// keep a sibling from the Channel its leases' upkeep runs on. Two: a
// Channel and one watch, or a Channel and its replacement while the
// server has not yet noticed the old one broke. A lineage of N nodes so
// holds at most its share and (SignalStreamReserve+StreamReserve)·N
// streams, each node a spawn its lineage paid for.
const StreamReserve = 2

// fitFileLimit lowers MaxConnections to what the process's open-file
// limit leaves room for, beside the health reserve and the store's own
// files (an eighth of the limit, at least fileHeadroom). Past the file
// limit the server cannot accept at all — not an operator's connection,
// nor one to close the oldest unauthenticated connection for — so a cap
// above it is no cap: whoever opened connections first would hold them.
func (l *ConnLimits) fitFileLimit(files int) {
	if files <= 0 {
		return
	}
	room := files - max(fileHeadroom, files/8) - l.HealthReserve
	if l.MaxConnections > room {
		l.fileLimited = l.MaxConnections
		l.MaxConnections = max(1, room)
	}
}

// fileHeadroom are the open files kept for the store, the listener and
// the server's own use when the open-file limit bounds the connections.
const fileHeadroom = 256

// check refuses limits that leave agents no connection.
func (l ConnLimits) check() error {
	if l.MaxConnections < 1 || l.HealthReserve < 1 || l.MaxConnectionsPerLineage < 1 || l.OperatorReserve < 0 {
		return fmt.Errorf("controlplane: connection limits must be positive (max connections %d, health reserve %d, per lineage %d, operator reserve %d)",
			l.MaxConnections, l.HealthReserve, l.MaxConnectionsPerLineage, l.OperatorReserve)
	}
	if l.OperatorReserve >= l.MaxConnections {
		return fmt.Errorf("controlplane: an operator reserve of %d connections leaves agents none of the %d (--operator-reserve must be below --max-connections)", l.OperatorReserve, l.MaxConnections)
	}
	return nil
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

// clientStreamingProcedures are the paths of the tether RPCs whose client
// streams messages (Session, Channel), each charged as it arrives.
var clientStreamingProcedures = sync.OnceValue(func() map[string]bool {
	out := map[string]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				if m := svc.Methods().Get(j); m.IsStreamingClient() {
					out["/"+string(svc.FullName())+"/"+string(m.Name())] = true
				}
			}
		}
		return true
	})
	return out
})

// BodyBytesPerRequest is how many bytes of a request's body one request of
// its caller's rate budget pays to decode, past the first
// BodyBytesPerRequest (auth.Interceptor.BodyBytesPerRequest): a message of
// many small fields, such as a Spawn of 100,000 labels in 1 MiB, took
// about 100 ms of CPU to decode, what about 140 small spawns cost
// (docs/capacity.md, "What a large request costs to decode"). A compressed
// body costs, up front, what one of --max-request-bytes does. Each message
// of a client stream (Session, the lease Channel) is priced so on its own,
// from its envelope's length, beside the request it costs once decoded.
const BodyBytesPerRequest = 4 << 10

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
// Each write of the stream still has stall (WriteTimeout) to be taken by
// the client (stallGuard): a stream lives as long as its client reads it.
//
// A stream whose request headers are larger than MaxStreamHeaderBytes, or
// hold more than MaxStreamHeaderFields fields, is refused
// (resource_exhausted) before it lifts anything: it would keep them for
// its life. So is one whose request declares trailers (invalid_argument):
// one Trailer field of 52 KB declared 9,000 names, which the request kept
// as a map of them beside its headers, not counted by the bound (some
// 850 KB of heap a stream), and the trailer fields sent later were kept
// too (rogue39b test TestRogue39BAStreamCannotKeepDeclaredTrailers).
func streamsUnbounded(stall time.Duration, next http.Handler) http.Handler {
	streaming := streamingProcedures()
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !streaming[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		if n := len(r.Trailer); n > 0 {
			// Declared trailers are kept for the stream's life: their
			// names as Request.Trailer's keys, and whatever trailer
			// fields the client sends later (up to --max-header-bytes,
			// declared or not) in the HTTP/2 stream's own map. No
			// stream of this server takes request trailers (Connect
			// ends a client stream with a message, gRPC with
			// END_STREAM); one that declares none has any it is sent
			// dropped.
			_ = errw.Write(w, r, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
				"the streams of this server take no request trailers, and this request declares %d (its Trailer header); send it without one", n)))
			return
		}
		if size, fields := headerList(r.Header); size > MaxStreamHeaderBytes || fields > MaxStreamHeaderFields {
			_ = errw.Write(w, r, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"a stream keeps its request headers while it lives, so they may hold at most %d bytes (each field's name and value and 32, as HTTP/2 counts them) in at most %d fields; these hold %d bytes in %d fields",
				MaxStreamHeaderBytes, MaxStreamHeaderFields, size, fields)))
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		g := newStallGuard(w, rc, stall)
		defer g.finish()
		next.ServeHTTP(g, r)
	})
}

// stallGuard gives each write and flush of a stream WriteTimeout to
// complete, from when it starts (a stream the client keeps reading has no
// deadline as a whole). A client that grants no flow-control window
// (HTTP/2), or does not read its connection, kept the stream's handler
// waiting in its write for as long as the connection lived — its
// goroutines and its caller's stream slot held, and the stream's end (its
// agent terminated, its token revoked) unseen, for a context's end does
// not reach a write waiting for window. A write found still waiting at
// three looks half the timeout apart (so it has waited at least the
// timeout, at most one and a half) now resets its stream (HTTP/1.1: fails
// its connection's write), which ends the handler and frees the slot.
//
// A write costs two atomic counts: the stream's one timer looks at them
// every half timeout, rather than being armed and stopped around each
// write (about a microsecond each on the loaded test machine) or a write
// deadline being moved per write (a message to the connection's serving
// goroutine each time).
type stallGuard struct {
	http.ResponseWriter
	rc    *http.ResponseController
	every time.Duration // half the timeout

	begun, ended atomic.Uint64 // writes begun and ended (one at a time)

	mu    sync.Mutex
	timer *time.Timer
	seen  uint64 // the write in progress at the last look (its number), 0: none
	looks int    // the looks that saw it in progress
	done  bool   // the handler returned: rc is no longer to be used
}

func newStallGuard(w http.ResponseWriter, rc *http.ResponseController, timeout time.Duration) *stallGuard {
	g := &stallGuard{ResponseWriter: w, rc: rc, every: max(timeout/2, time.Millisecond)}
	g.mu.Lock()
	g.timer = time.AfterFunc(g.every, g.look)
	g.mu.Unlock()
	return g
}

// look cuts the write in progress when the last two looks saw it too.
func (g *stallGuard) look() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return
	}
	begun := g.begun.Load()
	switch {
	case g.ended.Load() >= begun:
		g.seen, g.looks = 0, 0
	case begun != g.seen:
		g.seen, g.looks = begun, 1
	default:
		if g.looks++; g.looks >= 3 {
			// A deadline in the past: HTTP/2 resets the stream at once,
			// HTTP/1.1 fails the connection's write.
			_ = g.rc.SetWriteDeadline(time.Unix(1, 0))
			return
		}
	}
	g.timer.Reset(g.every)
}

func (g *stallGuard) finish() {
	g.mu.Lock()
	g.done = true
	g.timer.Stop()
	g.mu.Unlock()
}

func (g *stallGuard) begin() { g.begun.Add(1) }
func (g *stallGuard) end()   { g.ended.Add(1) }

func (g *stallGuard) Write(p []byte) (int, error) {
	g.begin()
	defer g.end()
	return g.ResponseWriter.Write(p)
}

// Flush is http.Flusher, which Connect requires of a stream's writer.
func (g *stallGuard) Flush() { _ = g.FlushError() }

func (g *stallGuard) FlushError() error {
	g.begin()
	defer g.end()
	return g.rc.Flush()
}

// Unwrap lets an http.ResponseController reach the stream.
func (g *stallGuard) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// connLimiter counts open connections and decides who may hold them.
//
// A connection is unauthenticated until a request on it is admitted (the
// auth Gate calls bind through auth.Interceptor.Bind): from then on it is
// bound to its caller — an agent's lineage, an operator, a tool server —
// and counts against that caller's perCaller connections and, when it
// carries an agent's requests, against the max-operatorReserve connections
// agents may hold together. A connection that carries several callers'
// requests counts against each of them.
//
// An unauthenticated connection is what anyone can open for the price of a
// TCP handshake, so it is what gives way: at max, Accept closes the oldest
// unauthenticated connection of the new one's source (auth.SourceOf), or
// of all when that source has none, to make room for the new one (a rogue
// opening connections at the cap closes its own, not another address's
// before its first call is admitted), and one that
// has not authenticated within preAuth is closed (if a request is in
// flight then, grace later). Only when every place is bound does a new
// connection go to the health reserve (GET /healthz only), whose oldest
// connection gives way in turn.
type connLimiter struct {
	net.Listener
	max, reserve    int
	perCaller       int
	operatorReserve int
	preAuth, grace  time.Duration
	idle            time.Duration // a bound connection without admitted work (idleCheck)
	// drain: how long a connection idleCheck judged has to close on its
	// own (its requests' read or write timeout, then net/http's idle
	// close, with room) before it is closed at once.
	drain     time.Duration
	plaintext bool // buffer reads (limitedConn)

	mu     sync.Mutex
	normal int       // open connections within max
	unauth list.List // unauthenticated connections within max, oldest first
	// bySource: those of unauth from each source address (auth.SourceOf),
	// oldest first.
	bySource map[string]*list.List
	health   list.List // health-only connections, oldest first
	callers  map[callerKey]int
	agents   int // connections bound to at least one agent lineage
	open     atomic.Int64
	// closing counts the open connections idleCheck found without
	// admitted work, which are closing gracefully.
	closing atomic.Int64
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
	l          *connLimiter

	// bound is set once a request on it was admitted; keys are the callers
	// it is bound to (written under l.mu and keysMu, read under keysMu).
	bound atomic.Bool
	// unadmitted counts the requests in flight that were not admitted,
	// public those of public endpoints, writing those writing an answer
	// while it is bound (preAuthBounded).
	unadmitted, public, writing atomic.Int64
	// begun counts the requests begun on it, admissions those admitted,
	// admittedInFlight those in flight (admittedRequests), for idleCheck.
	begun, admissions atomic.Uint64
	admittedInFlight  atomic.Int64
	// closing is set once idleCheck judged it without admitted work: each
	// answer written on it from then on says so (Connection: close;
	// HTTP/2: GOAWAY).
	closing atomic.Bool
	// waiting are its requests that were not admitted and may wait long:
	// public ones, and answers being written while it is bound
	// (preAuthWriter.wait); idleCheck resets them when it judges the
	// connection.
	waitingMu sync.Mutex
	waiting   map[*preAuthWriter]struct{}
	keysMu    sync.Mutex
	keys      []callerKey
	// budget is the rate budget (auth.Principal.Budget) of the first
	// caller bound to it (boundBudget).
	budget atomic.Pointer[string]
	// guard is its HTTP/2 frame guard, when its frames are budgeted
	// (frameBudget).
	guard atomic.Pointer[frameGuard]

	// Guarded by l.mu.
	elem    *list.Element // in l.unauth or l.health while unauthenticated
	srcElem *list.Element // in l.bySource[src] while in l.unauth
	src     string        // its peer's source address (auth.SourceOf)
	timer   *time.Timer   // the pre-authentication window
	active  bool          // a request is in flight (http.ConnState)
	expired bool          // the window passed while a request was in flight
	agent   bool          // counted in l.agents
	gone    bool          // forgotten: closed, evicted or expired
	idle    *time.Timer   // idleCheck's, once bound
	seen    [2]uint64     // begun and admissions at idleCheck's last look
	judged  time.Time     // when idleCheck set closing
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
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// forgetLocked frees c's place and its callers' counts, once.
func (l *connLimiter) forgetLocked(c *limitedConn) {
	if c.gone {
		return
	}
	c.gone = true
	l.open.Add(-1)
	switch {
	case c.healthOnly:
		l.health.Remove(c.elem) // a health-only connection is never bound
	case c.elem != nil:
		l.unauth.Remove(c.elem)
		l.leaveSourceLocked(c)
	}
	if !c.healthOnly {
		l.normal--
	}
	c.elem = nil
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
	c.keysMu.Lock()
	for _, k := range c.keys {
		if l.callers[k]--; l.callers[k] <= 0 {
			delete(l.callers, k)
		}
	}
	c.keysMu.Unlock()
	if c.agent {
		l.agents--
	}
	if c.closing.Load() {
		l.closing.Add(-1)
	}
}

// leaveSourceLocked takes c out of its source's unauthenticated
// connections. l.mu is held.
func (l *connLimiter) leaveSourceLocked(c *limitedConn) {
	if c.srcElem == nil {
		return
	}
	if q := l.bySource[c.src]; q != nil {
		q.Remove(c.srcElem)
		if q.Len() == 0 {
			delete(l.bySource, c.src)
		}
	}
	c.srcElem = nil
}

func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l}
	if ra := c.RemoteAddr(); ra != nil {
		lc.src = auth.SourceOf(ra.String())
	}
	var victim *limitedConn
	l.mu.Lock()
	switch {
	case l.normal < l.max:
	case l.bySource[lc.src] != nil: // never empty: an emptied list is deleted
		// The newcomer's own source gives way first: a rogue opening
		// connections at the cap closed the oldest unauthenticated one
		// whoever's it was, an honest agent's new connection before its
		// first call was admitted among them (rogue33b test). A source
		// with none pending (its first connection at the cap) takes the
		// oldest of all, as before.
		victim = l.bySource[lc.src].Front().Value.(*limitedConn)
	case l.unauth.Len() > 0:
		victim = l.unauth.Front().Value.(*limitedConn)
	case l.health.Len() < l.reserve:
		lc.healthOnly = true
	default: // the reserve is at least 1 (ConnLimits.check)
		victim = l.health.Front().Value.(*limitedConn)
		lc.healthOnly = true
	}
	if victim != nil {
		l.forgetLocked(victim)
	}
	l.open.Add(1)
	if lc.healthOnly {
		lc.elem = l.health.PushBack(lc)
	} else {
		l.normal++
		lc.elem = l.unauth.PushBack(lc)
		if l.bySource == nil {
			l.bySource = map[string]*list.List{}
		}
		q := l.bySource[lc.src]
		if q == nil {
			q = list.New()
			l.bySource[lc.src] = q
		}
		lc.srcElem = q.PushBack(lc)
	}
	lc.timer = time.AfterFunc(l.preAuth, func() { l.expire(lc) })
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
	}
	if l.plaintext {
		lc.r = bufio.NewReaderSize(c, connReadBuffer)
	}
	return lc, nil
}

// expire closes c if it is still unauthenticated when its window passes:
// at once when no request is in flight on it, otherwise grace later (an
// unauthenticated request's answer has WriteTimeout from its start).
func (l *connLimiter) expire(c *limitedConn) {
	l.mu.Lock()
	if c.gone || c.elem == nil {
		l.mu.Unlock()
		return
	}
	if c.active && !c.expired {
		c.expired = true
		c.timer = time.AfterFunc(l.grace, func() { l.expire(c) })
		l.mu.Unlock()
		return
	}
	l.forgetLocked(c)
	l.mu.Unlock()
	_ = c.Conn.Close()
}

// connState follows whether an unauthenticated connection has a request
// in flight (the http.Server's ConnState hook; HTTP/2 reports a
// connection active while it has an open stream).
func (l *connLimiter) connState(nc net.Conn, state http.ConnState) {
	c := limitedOf(nc)
	if c == nil || c.bound.Load() {
		return
	}
	l.mu.Lock()
	c.active = state == http.StateActive
	l.mu.Unlock()
}

// limitedOf finds the limitedConn under what the http.Server hands its
// hooks: the connection itself, a TLS connection over it, (HTTP/2
// cleartext) a TLS connection wrapping it unencrypted, or (HTTP/2) the
// frameGuard over either.
func limitedOf(c net.Conn) *limitedConn {
	for range 4 {
		switch v := c.(type) {
		case *limitedConn:
			return v
		case *frameGuard:
			c = v.Conn
		case *tlsFrameGuard:
			c = v.tc
		case *tls.Conn:
			c = v.NetConn()
		case interface{ UnencryptedNetConn() net.Conn }:
			c = v.UnencryptedNetConn()
		default:
			return nil
		}
	}
	return nil
}

// callerKey is what a connection is bound to: an agent's lineage, which
// its root and every descendant share, or any other caller's principal
// (built without allocating: every admitted request looks its key up).
type callerKey struct {
	kind auth.Kind
	name string // the lineage (agents), the subject (others); node: the node id
	node bool   // an agent node's own count (ConnectionReserve)
	// reserve: a lineage's count of the connections its nodes bound past
	// its share (ConnectionReserve), at most reservesOf(share).
	reserve bool
}

func keyOf(p auth.Principal) callerKey {
	if p.IsAgent() && p.Lineage != "" {
		return callerKey{kind: p.Kind, name: p.Lineage}
	}
	return callerKey{kind: p.Kind, name: p.Subject}
}

// nodeKeyOf is the key that counts the connections an agent node's calls
// bound, within its lineage's share or past it (ConnectionReserve).
func nodeKeyOf(p auth.Principal) (callerKey, bool) {
	if p.IsAgent() && p.Lineage != "" {
		return callerKey{kind: p.Kind, name: p.Subject, node: true}, true
	}
	return callerKey{}, false
}

// reserveKeyOf is the key that counts the connections an agent's
// lineage's nodes bound past its share (reservesOf).
func reserveKeyOf(p auth.Principal) callerKey {
	return callerKey{kind: p.Kind, name: p.Lineage, reserve: true}
}

// ConnectionReserve is how many connections an agent node that bound none
// may bind past its lineage's share (ConnLimits.MaxConnectionsPerLineage):
// a member of the lineage holding the share cannot keep a sibling that
// holds no connection — a child just spawned, one whose connection broke —
// from the server, where its session and signal streams
// (SignalStreamReserve) are. A node counts the connections its calls bound,
// within the share or past it; a connection it only shares with the node
// that bound it is not counted. A lineage of N nodes so holds at most its
// share and min(N, reservesOf(share)) connections. One: a
// node whose connection broke is let in once the server has noticed (its
// pings unanswered, or the connection closed); until then it is refused as
// before.
const ConnectionReserve = 1

// reservesOf bounds the connections a lineage's nodes bind past its share
// (ConnectionReserve) together: a quarter of the share, at least one. A
// lineage of N nodes held its share and N connections, and a rogue that
// spawned children enough (each a spawn of its own budget) had them fill
// every connection agents may hold, keeping every other lineage off the
// server. A lineage now holds at most its share and a quarter more.
func reservesOf(share int) int { return max(1, share/4) }

// bind binds c to p's caller, or refuses the request — resource_exhausted,
// naming the limit — when the caller, or agents together, hold every
// connection they may. A refused request changes nothing, and the Gate
// closes its connection (HTTP/2: GOAWAY, then closed once its admitted
// streams end) — unless the request was forwarded by another replica,
// whose connection carries other callers' calls (shared:
// auth.Interceptor.SharedConn), and the refusal says which.
func (c *limitedConn) bind(p auth.Principal, shared bool) error {
	key := keyOf(p)
	node, isNode := nodeKeyOf(p)
	c.keysMu.Lock()
	has := slices.Contains(c.keys, key) || isNode && slices.Contains(c.keys, node)
	c.keysMu.Unlock()
	if has {
		return nil
	}
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.gone {
		return nil // closed meanwhile: nothing left to count
	}
	c.keysMu.Lock()
	has = slices.Contains(c.keys, key) || isNode && slices.Contains(c.keys, node)
	c.keysMu.Unlock()
	if has {
		return nil
	}
	// reserve: past the lineage's share, a node that bound none
	// (ConnectionReserve); the connection counts for the node alone.
	reserve := false
	if n := l.callers[key]; n >= l.perCaller {
		if !isNode || l.callers[node] >= ConnectionReserve {
			who, per, own := p.ID(), "caller", ""
			if isNode {
				who, per = fmt.Sprintf("lineage %s (%s shares it with its root and every descendant)", p.Lineage, p.ID()), "lineage"
				own = fmt.Sprintf(", and %s already holds %s of its own (a node holding none may bind %d past the share)", p.ID(), connections(l.callers[node]), ConnectionReserve)
			}
			return tooManyConnections(shared, fmt.Sprintf("%s already holds %s to this server, the limit per %s (tether serve --max-connections-per-lineage)%s", who, connections(n), per, own))
		}
		if r := l.callers[reserveKeyOf(p)]; r >= reservesOf(l.perCaller) {
			return tooManyConnections(shared, fmt.Sprintf("lineage %s (%s shares it with its root and every descendant) already holds %s to this server, the limit per lineage (tether serve --max-connections-per-lineage), and its nodes %d more past it, the most a lineage's nodes may bind past its share (a quarter of it)", p.Lineage, p.ID(), connections(n), r))
		}
		reserve = true
	}
	if p.IsAgent() && !c.agent && l.agents >= l.max-l.operatorReserve {
		return tooManyConnections(shared, fmt.Sprintf("agents already hold %d of the server's %s; the other %d are kept for operators and tool servers (tether serve --operator-reserve)", l.agents, connections(l.max), l.operatorReserve))
	}
	if l.callers == nil {
		l.callers = map[callerKey]int{}
	}
	if !reserve {
		l.callers[key]++
	}
	if isNode {
		l.callers[node]++
	}
	if reserve {
		l.callers[reserveKeyOf(p)]++
	}
	if p.IsAgent() && !c.agent {
		c.agent = true
		l.agents++
	}
	c.keysMu.Lock()
	if !reserve {
		c.keys = append(c.keys, key)
	}
	if isNode {
		c.keys = append(c.keys, node)
	}
	if reserve {
		c.keys = append(c.keys, reserveKeyOf(p))
	}
	c.keysMu.Unlock()
	if c.elem != nil && !c.healthOnly {
		l.unauth.Remove(c.elem)
		l.leaveSourceLocked(c)
		c.elem = nil
		if c.timer != nil {
			c.timer.Stop()
			c.timer = nil
		}
	}
	if c.idle == nil && l.idle > 0 {
		c.seen = [2]uint64{c.begun.Load(), c.admissions.Load()}
		c.idle = time.AfterFunc(l.idle, func() { l.idleCheck(c) })
	}
	budget := p.Budget()
	c.budget.CompareAndSwap(nil, &budget)
	c.bound.Store(true)
	return nil
}

// idleCheck closes a bound connection that carried requests since its
// last look, an idle timeout ago, or has some in flight, none of them
// admitted. net/http idles out a connection only when it carries no
// request at all, so one bound to a caller was kept for ever by requests
// that are never admitted — a dead agent's refused calls, a GET /healthz
// now and then — its place counted against its lineage's share and the
// connections agents may hold together, where no newcomer can take it. An
// admitted stream (a session, a watch) is in flight while it lives, and
// keeps its connection; one that carries nothing is left to net/http,
// which closes it with a GOAWAY, so that a call sent as it closes is
// retried.
//
// The close is graceful: the connection is marked closing, and every
// answer written on it from then on carries Connection: close (HTTP/2: a
// GOAWAY, the connection closed once its streams end), so that a call its
// client sends at that moment is answered, or retried on a new connection,
// rather than cut off (preAuthBounded). A request in flight ends within
// its read or write timeout, and a connection then carrying nothing is
// closed by net/http's idle close, with its GOAWAY: the requests that may
// wait long (public ones, unadmitted answers being written) have their
// streams reset when it is judged, so that it carries nothing soon. One
// still open drain after it was judged, with no admitted work since, is
// closed at once.
func (l *connLimiter) idleCheck(c *limitedConn) {
	l.mu.Lock()
	if c.gone || c.idle == nil {
		l.mu.Unlock()
		return
	}
	now := [2]uint64{c.begun.Load(), c.admissions.Load()}
	quiet := now[0] == c.seen[0] && c.unadmitted.Load() == 0
	closing := c.closing.Load()
	if now[1] != c.seen[1] || c.admittedInFlight.Load() > 0 || quiet && !closing || closing && time.Since(c.judged) < l.drain {
		c.seen = now
		c.idle.Reset(l.idle)
		l.mu.Unlock()
		return
	}
	if !closing {
		c.judged = time.Now()
		c.closing.Store(true)
		l.closing.Add(1)
		c.seen = now
		c.idle.Reset(l.idle)
		l.mu.Unlock()
		c.cutWaiting()
		return
	}
	l.forgetLocked(c)
	l.mu.Unlock()
	_ = c.Conn.Close()
}

func connections(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}

// tooManyConnections refuses a call whose caller holds every connection it
// may. A call on a connection that carries other callers' calls (shared:
// one another replica forwarded) is refused alone, its connection kept:
// its refusal, which reaches the caller through the replica it called,
// says so, and names the connections to close — those it holds to this
// replica, not to the one it called, whose connection stays open.
func tooManyConnections(shared bool, what string) error {
	if shared {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: %s; the call was forwarded to this replica (the one serving the job leases) by the replica you called, and is refused alone, your connection to that one kept: close one of the connections you hold to this replica first", auth.ErrTooManyConnections, what))
	}
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: %s; this connection is being closed: send further calls over one you hold (HTTP/2 carries many at once) or close one first", auth.ErrTooManyConnections, what))
}

// bindConn is auth.Interceptor.Bind: it binds the connection a request
// arrived on (connContext put it in the request's context; a request
// served by Handler has none, and is not counted).
func bindConn(ctx context.Context, p auth.Principal, shared bool) error {
	c, _ := ctx.Value(connKey{}).(*limitedConn)
	if c == nil {
		return nil
	}
	return c.bind(p, shared)
}

// boundBudget is auth.Interceptor.BoundBudget: the rate budget of the
// first caller the request's connection was bound to, or "". A request
// on it pays for its credential's verification from that caller's
// budget for requests without a valid credential, not from its
// address's, which a rogue behind the same address (a NAT) may keep
// spent (rogue32e test).
func boundBudget(ctx context.Context) string {
	c, _ := ctx.Value(connKey{}).(*limitedConn)
	if c == nil {
		return ""
	}
	if b := c.budget.Load(); b != nil {
		return *b
	}
	return ""
}

// connKey carries a request's *limitedConn.
type connKey struct{}

// connContext puts the connection in its requests' contexts.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc := limitedOf(c); lc != nil {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// healthOnly answers every request of a connection accepted past
// MaxConnections with 503, except GET /healthz: an orchestrator's probe
// still learns the server is alive while it is full.
func healthOnly(max int, next http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := r.Context().Value(connKey{}).(*limitedConn); c == nil || !c.healthOnly || (r.Method == http.MethodGet && r.URL.Path == "/healthz") {
			next.ServeHTTP(w, r)
			return
		}
		// Closed after the answer (HTTP/2: GOAWAY), so that the client's
		// next call opens a connection that may find a place, instead of
		// being refused on this one for as long as it keeps it.
		w.Header().Set("Connection", "close")
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

// boundedMessages bounds every message a Connect handler reads to limit
// bytes, compressed and decompressed alike (boundedGzip): the options of
// every handler on the port, the public ones (gRPC health, server
// reflection) with the API's. Until the forty-third pass the public ones
// had the limit without boundedGzip, and anyone who could reach the port
// had the server inflate a gzip bomb in full to report its size, before
// any credential or budget (the health check charges none; reflection
// charges a message once it is read).
func boundedMessages(limit int) connect.HandlerOption {
	return connect.WithHandlerOptions(connect.WithReadMaxBytes(limit), boundedGzip(limit))
}

// MaxPublicMessageBytes bounds a message of the endpoints served without
// a credential on the API's port (gRPC health, server reflection),
// compressed and decompressed alike, below --max-request-bytes: their
// requests name a service, a file or a symbol, and each is decoded before
// any budget is charged for it (the health check charges none). At the
// API's limit, 1 KiB of gzip inflated to a MiB of fields for the server
// to decode, free, eight at once on every connection anyone may open.
const MaxPublicMessageBytes = 4 << 10

// publicMessages is boundedMessages for the public endpoints: at most
// MaxPublicMessageBytes, and never more than the API's limit. Their
// answers are gzipped, for a client that accepts it, only from
// compressMinBytes, as the API's are: Connect's default gzips an answer of
// any size, and until the forty-fifth pass a health check's answer of two
// bytes had the server reset a flate compressor for anyone who asked
// (rogue45g test TestRogue45GPublicEndpointsDoNotGzipSmallAnswers).
func publicMessages(limit int) connect.HandlerOption {
	return connect.WithHandlerOptions(boundedMessages(min(limit, MaxPublicMessageBytes)), connect.WithCompressMinBytes(compressMinBytes))
}

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

// ClosingConnections is how many of the open connections are closing for
// want of admitted work (a bound connection that carried none for the
// idle timeout, ConnLimits.IdleTimeout): each is told so (HTTP/2:
// GOAWAY) and closes once what is in flight on it ends.
func (s *Server) ClosingConnections() int {
	conns := s.conns.Load()
	if conns == nil {
		return 0
	}
	return int(conns.closing.Load())
}

// ThrottledConnections is how many HTTP/2 connections the server reads
// no further now until their frame budget refills
// (ConnLimits.ControlFrames).
func (s *Server) ThrottledConnections() int { return int(s.throttled.Load()) }

// OpenStreams is how many streams principal (e.g. "agent:n_…") holds open
// on this server now.
func (s *Server) OpenStreams(principal string) int { return s.authn.OpenStreams(principal) }

// UnreadAnswers is how many answers of principal's (e.g. "agent:n_…")
// admitted unary calls are being written on this server, and how many of
// its lineage's share (answersBounded).
func (s *Server) UnreadAnswers(principal, lineage string) (int, int) {
	return s.authn.UnreadAnswers(principal, lineage)
}

// AwaitedBodies is how many calls of principal (e.g. "agent:n_…") were
// admitted from their headers and wait for their bodies on this server
// now, and how many of lineage's share (its root's node id) do.
func (s *Server) AwaitedBodies(principal, lineage string) (int, int) {
	return s.authn.AwaitedBodies(principal, lineage)
}

// OpenLineageStreams is how many streams the agents of lineage (its
// root's node id) hold open on this server now, their signal streams
// admitted from their nodes' reserves included.
func (s *Server) OpenLineageStreams(lineage string) int {
	return s.authn.OpenLineageStreams(lineage)
}

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

// AnswerBytesPerRequest is how many bytes of a unary call's answer one
// request of the caller's rate budget buys: an answer costs a request per
// AnswerBytesPerRequest past its first, beyond what the call already paid
// for its work (a subtree listing's request per thousand nodes read, which
// an answer of a thousand plain nodes is well within), taken once it is
// built even past what the budget has left. A listing whose size the
// caller shapes (the stop rules in effect at a node of a deep chain, each
// rule kilobytes) answered megabytes for one request.
const AnswerBytesPerRequest = 256 << 10

// PreAuthRequests bounds the requests in flight on a connection that were
// not admitted (not authenticated by the auth Gate: refused calls, public
// endpoints, console pages).
//
// On a connection none of whose requests was admitted yet (an
// unauthenticated one), a request counts from its start until its answer
// is written, and one that starts past the bound and is not admitted
// itself closes the connection: a public endpoint's at once, an RPC's (or
// a console page's) when it would write its answer.
//
// On a connection bound to a caller, a public endpoint's request that
// starts while this many others are in flight has its stream reset at
// once, and so has a refusal (or a console page, unless a call of its own
// session was admitted as an operator's) whose answer would be written
// while this many answers of requests that were not admitted are still
// being written on the connection: the connection is kept, for it may carry other callers'
// calls (a follower's forwarded ones), and an honest client, which takes
// its answers, has hardly any being written at once.
//
// A client that does not take its answers (it grants no flow-control
// window) so holds at most this many waiting writes on a connection.
// HTTP/2 lets a connection carry MaxStreamsPerConn requests at once, and
// each refusal (or public answer) not taken held its goroutine and
// request until its write deadline: some 250 goroutines and 2.5 MB per
// connection, without a credential, over as many connections as the
// server takes — or, once a call of its had bound the connection, over
// its lineage's share of the connections, its node dead or alive. An
// honest client's burst is admitted as it comes (an admitted request never
// counts once admitted), and a client whose credential is dead is told so
// on up to this many calls at once.
const PreAuthRequests = 8

// MaxDeclaredTrailers bounds the trailer names a request may declare (its
// Trailer header). net/http takes that field out of the headers and keeps
// the names as a map for the request's life (HTTP/2: in the stream
// itself), made before any handler runs: one field of 52 KB, within
// ConnLimits.MaxHeaderBytes, declared 9,000 names, some 850 KB of heap,
// held while the request's answer waited to be written to a client that
// grants no flow-control window — eight refusals on each connection
// without a credential (PreAuthRequests), or an agent's answers over its
// lineage's share. No call of the API takes request trailers (a stream
// declaring any is refused: streamsUnbounded). A request declaring more is
// answered 431 in headers alone, which flow control does not hold, so
// that it ends at once (rogue39b test
// TestRogue39BBRequestDeclaringManyTrailersIsNotKeptWaitingForItsAnswer).
const MaxDeclaredTrailers = 8

// MaxRequestTarget bounds a request's target (its path and query, as
// sent). A refusal waiting to be written drops its request's headers
// (auth's Gate), but net/http keeps the target in the request (RequestURI,
// and the URL parsed from it), and it may fill ConnLimits.MaxHeaderBytes
// alone: eight refusals on each connection without a credential
// (PreAuthRequests) each kept 60 KB of it while waiting to be written to a
// client granting no flow-control window. No procedure, console page or
// public endpoint has a target near this; a longer one is answered 414 in
// headers alone, which flow control does not hold (rogue39b test
// TestRogue39BCLongRequestTargetIsNotKeptWaitingForItsAnswer).
const MaxRequestTarget = 8 << 10

// refuseInHeaders answers a request whose target is longer than
// MaxRequestTarget (414) or that declares more than MaxDeclaredTrailers
// trailer names (431): the status, no body (its answer's headers end the
// stream, whatever window the client grants), and the connection closed
// after it (HTTP/2: GOAWAY).
func refuseInHeaders(w http.ResponseWriter, status int) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(status)
}

// preAuthBounded holds a connection to PreAuthRequests requests in flight
// that were not admitted (see there); guards says which paths are RPCs the
// auth Gate judges (the others are public and never admitted).
// admittedRequests, behind the Gate, takes an admitted request out of the
// count.
func preAuthBounded(guards func(path string) bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case len(r.RequestURI) > MaxRequestTarget:
			refuseInHeaders(w, http.StatusRequestURITooLong)
			return
		case len(r.Trailer) > MaxDeclaredTrailers:
			refuseInHeaders(w, http.StatusRequestHeaderFieldsTooLarge)
			return
		}
		c, _ := r.Context().Value(connKey{}).(*limitedConn)
		if c == nil {
			next.ServeHTTP(w, r)
			return
		}
		c.begun.Add(1)
		over := c.unadmitted.Add(1) > PreAuthRequests
		pw := &preAuthWriter{ResponseWriter: w, c: c, over: over, page: consolePage(r), h2: r.ProtoMajor == 2}
		defer pw.end()
		pw.goingAway()
		if pw.h2 && r.Body != nil && r.Body != http.NoBody && !(!pw.page && !guards(r.URL.Path) && enveloped(r)) {
			// Discarded once its answer begins, unless admitted (see
			// discardBody); a public stream reads its messages as it
			// answers them, and keeps it.
			pw.body = r.Body
		}
		if pw.page {
			// The console's calls to the API for the page carry its
			// context: admittedRequests marks the page live.
			r = r.WithContext(context.WithValue(r.Context(), pageKey{}, pw))
		}
		if !pw.page && !guards(r.URL.Path) {
			// A public request may wait without writing (a stream waiting
			// for a message): past the bound it is not let in. On a bound
			// connection only public requests count for it (calls being
			// authenticated are an honest client's business).
			pw.public = true
			pw.wait()
			if c.public.Add(1) > PreAuthRequests && c.bound.Load() || over && !c.bound.Load() {
				pw.refuse()
				return
			}
		}
		next.ServeHTTP(pw, r)
		if !pw.admitted {
			// A call the Gate judged and did not admit earns frames
			// (FramesPerRequest) only on a connection a call has bound:
			// a follower's, whose callers' refused calls ride with their
			// admitted ones. On one no call has bound, each refusal
			// (charged to its address's budget, and past it free)
			// earned its sender the frames of the next ones: refused as
			// fast as it asked, never slowed (rogue48g test). A console
			// page earns nothing itself: the console's calls to the API
			// for a signed-in browser's page pass here, judged and
			// earning; one without a session is charged to nobody.
			if guards(r.URL.Path) && c.bound.Load() {
				c.earnFrames()
			}
			// Hold the place until the answer is written (the server
			// writes what is left of it after the handler returns).
			_ = pw.FlushError()
		}
	})
}

// admittedRequests sits behind the auth Gate: each request it admitted
// (its context carries the principal; the Gate passes public requests on
// too) leaves preAuthBounded's count, is counted for idleCheck, and is
// served with the connection's own writer. An operator's call the console
// makes for a page (its context carries the page's writer) marks the page
// live (preAuthWriter.live).
func admittedRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pw, ok := w.(*preAuthWriter); ok {
			if p, admitted := auth.FromContext(r.Context()); admitted {
				if page, _ := r.Context().Value(pageKey{}).(*preAuthWriter); page != nil && page != pw && p.Kind == auth.KindOperator {
					page.live.Store(true)
				}
				pw.admit()
				w = pw.ResponseWriter
				c := pw.c
				c.earnFrames()
				c.admissions.Add(1)
				c.admittedInFlight.Add(1)
				defer c.admittedInFlight.Add(-1)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// earnFrames credits a request the auth Gate judges (an RPC admitted, the
// console's calls for a page among them, or refused on a bound
// connection) to the connection's frame budget (FramesPerRequest). A
// public endpoint's (GET /healthz), a console page's own and a refusal on
// a connection no call has bound earn nothing: charged to nobody, or to
// the anonymous budget only until it is spent, they would buy their
// sender frames for free.
func (c *limitedConn) earnFrames() {
	if g := c.guard.Load(); g != nil {
		g.earn(FramesPerRequest)
	}
}

// answersBounded sits behind admittedRequests: the answer of an admitted
// unary call takes a slot of its caller's (auth.Interceptor.TakeAnswer)
// when it begins to be written, given back once it is written (HTTP/2:
// flushed) or its stream is reset. A client that grants no
// flow-control window kept each answer waiting until --write-timeout,
// its handler's goroutine and its answer held, bounded per connection
// only (--max-streams-per-conn): 400 answers on four connections of one
// agent held 400 goroutines (rogue37b test). An answer past its caller's
// slots has its stream reset instead of being written (the call was done,
// and charged). Streams are bounded as streams; a request that was not
// admitted, by PreAuthRequests.
func answersBounded(take func(p auth.Principal, procedure string) (func(), error), next http.Handler) http.Handler {
	streaming := streamingProcedures()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, admitted := auth.FromContext(r.Context())
		if !admitted || streaming[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		aw := &answerWriter{ResponseWriter: w, take: func() (func(), error) { return take(p, r.URL.Path) }}
		next.ServeHTTP(aw, r)
		if aw.release == nil {
			return
		}
		if r.ProtoMajor == 2 {
			// HTTP/2 writes what is left of an answer after its handler
			// returns (and ends its request's context first): the slot
			// is given back once the stream is closed — its last frame
			// written, or the stream reset — so an answer waiting for a
			// window its client does not grant holds its slot. (A flush
			// here would hold it too, at the cost of an empty DATA frame
			// a call to end the stream.) HTTP/1.1 carries one request at
			// a time, its answer's write bounded by its connection's.
			//
			// The connection's frame guard is told the answer comes: its
			// HEADERS wait for its DATA, to go out in one write.
			if closed := streamClosed(w); closed != nil {
				release := aw.release
				var g *frameGuard
				if c, _ := r.Context().Value(connKey{}).(*limitedConn); c != nil {
					g = c.guard.Load()
				}
				if g != nil {
					g.answerComing()
				}
				go func() {
					<-closed
					release()
					if g != nil {
						g.answerDone()
					}
				}()
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
		aw.release()
	})
}

// streamClosed is the channel an HTTP/2 stream's writer reports its
// stream closed on (http.CloseNotifier: its last frame written or the
// stream reset), reached through the writers wrapping it; nil if none
// has one.
func streamClosed(w http.ResponseWriter) <-chan bool {
	for {
		// Deprecated, but CloseNotifier is the one signal of an HTTP/2 stream's end that outlives its handler.
		if cn, ok := w.(http.CloseNotifier); ok {
			return cn.CloseNotify()
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
}

// errAnswerCut is what a write gets once its answer was refused a slot
// (answersBounded).
var errAnswerCut = errors.New("controlplane: the answer was not written: its caller has too many answers being written that its client has not taken")

// answerWriter takes its answer's slot at its first write (answersBounded).
type answerWriter struct {
	http.ResponseWriter
	take    func() (func(), error)
	began   bool
	cut     bool
	release func()
}

// begin takes the slot once; false: the answer may not be written, and
// its stream is reset.
func (w *answerWriter) begin() bool {
	if !w.began {
		w.began = true
		release, err := w.take()
		if err != nil {
			w.cut = true
			// A deadline in the past: HTTP/2 resets the stream at once;
			// HTTP/1.1 fails its connection's write.
			_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Unix(1, 0))
		}
		w.release = release
	}
	return !w.cut
}

func (w *answerWriter) WriteHeader(code int) {
	if w.begin() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *answerWriter) Write(p []byte) (int, error) {
	if !w.begin() {
		return 0, errAnswerCut
	}
	return w.ResponseWriter.Write(p)
}

// Flush is http.Flusher.
func (w *answerWriter) Flush() { _ = w.FlushError() }

func (w *answerWriter) FlushError() error {
	if !w.begin() {
		return errAnswerCut
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets an http.ResponseController reach the stream.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// consolePage reports whether r asks for a page of the operator console:
// the browser's session (a cookie) is checked by the console, whose calls
// to the API for the page bind the connection to the operator before the
// page is written, so a page past PreAuthRequests is judged when it
// writes, not at once (a browser restoring a dozen console tabs opens them
// on one fresh connection), and written when one of those calls was
// admitted as an operator's by then (live): the session's credential is
// live. A page has no body to wait for; anything else under /ui/ (a
// sign-in's form) does.
func consolePage(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasPrefix(r.URL.Path, "/ui/")
}

// preAuthWriter is the writer of a request until it is admitted. One past
// PreAuthRequests that was not admitted gives up its place rather than
// write (refuse).
type preAuthWriter struct {
	http.ResponseWriter
	c    *limitedConn
	over bool // it began past the bound (unadmitted)
	page bool // a console page (consolePage)
	h2   bool // an HTTP/2 stream (the console's in-process calls are not)
	// live: a console page one of whose calls to the API was admitted as
	// an operator's (admittedRequests): its session's credential is live,
	// and it is written past the bound. A connection once bound to an
	// operator wrote every page so, whoever asked, after the operator's
	// token was revoked or had expired.
	live     atomic.Bool
	admitted bool // admitted by the Gate, or ended: out of unadmitted
	writing  bool // counted in the connection's writing
	public   bool // a public endpoint's, counted in the connection's public
	refused  bool
	told     bool // its answer says the connection is closing (goingAway)
	waits    bool // among its connection's waiting (wait)
	// body is the request's body, to be discarded once its answer
	// begins unless the request was admitted (discardBody); nil: kept.
	body io.Closer
}

// discardBody closes the body of a request that was not admitted once its
// answer begins (HTTP/2): every request not admitted reads what it needs
// of its body before it answers (a refusal from the headers reads none),
// and a body left unread stayed in the server's buffers — up to the
// connection's window, MaxReceiveBufferBytes — for as long as the answer
// waited to be written to a client that took none of it. Closed, what it
// holds is freed and what more arrives is given back as it comes. A public
// stream (Connect or gRPC framing: server reflection) reads its messages
// while it answers and keeps its body; over HTTP/1.1 closing a body reads
// what is left of it, so it is left to the server, which closes the
// connection.
func (w *preAuthWriter) discardBody() {
	if w.body != nil && !w.admitted {
		_ = w.body.Close()
	}
	w.body = nil
}

// enveloped reports whether r's body is framed as Connect's streams and
// gRPC frame their messages.
func enveloped(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "application/connect+") || strings.HasPrefix(ct, "application/grpc")
}

// pageKey carries a console page's *preAuthWriter to the console's calls
// to the API for it.
type pageKey struct{}

// errPreAuthCut is what a write gets once its request gave up its place
// for having too many requests in flight that were not admitted.
var errPreAuthCut = errors.New("controlplane: the request was refused: too many requests in flight on its connection that were not admitted")

// admit takes the request out of its connection's count, once: when the
// Gate admits it, or when it ends.
func (w *preAuthWriter) admit() {
	if !w.admitted {
		w.admitted = true
		w.c.unadmitted.Add(-1)
	}
}

// end takes the request out of the counts once its answer is written.
func (w *preAuthWriter) end() {
	w.admit()
	if w.writing {
		w.writing = false
		w.c.writing.Add(-1)
	}
	if w.public {
		w.public = false
		w.c.public.Add(-1)
	}
	if w.waits {
		w.waits = false
		w.c.waitingMu.Lock()
		delete(w.c.waiting, w)
		w.c.waitingMu.Unlock()
	}
}

// goingAway has the answer say the connection is closing (Connection:
// close; HTTP/2: GOAWAY) once idleCheck judged it (limitedConn.closing),
// until the answer's headers are written; an admitted request's writer is
// told at its start.
func (w *preAuthWriter) goingAway() {
	if !w.told && w.c.closing.Load() {
		w.told = true
		w.ResponseWriter.Header().Set("Connection", "close")
	}
}

// wait notes the request among its connection's waiting, once.
func (w *preAuthWriter) wait() {
	if w.waits {
		return
	}
	w.waits = true
	c := w.c
	c.waitingMu.Lock()
	if c.waiting == nil {
		c.waiting = map[*preAuthWriter]struct{}{}
	}
	c.waiting[w] = struct{}{}
	c.waitingMu.Unlock()
}

// cutWaiting resets the streams of c's waiting requests (HTTP/2; an
// HTTP/1.1 request has its connection's write deadline). A request leaves
// waiting before its handler returns (end), so each is live while cut.
func (c *limitedConn) cutWaiting() {
	c.waitingMu.Lock()
	defer c.waitingMu.Unlock()
	for w := range c.waiting {
		if w.h2 {
			_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Unix(1, 0))
		}
	}
}

// cuts refuses the request when it may not write.
func (w *preAuthWriter) cuts() bool {
	w.goingAway()
	switch {
	case w.refused:
		return true
	case w.admitted || (w.page && w.live.Load()):
		return false
	case w.c.bound.Load():
		// Judged by the answers being written on the connection's
		// streams (an HTTP/1.1 connection writes one at a time; the
		// console's in-process calls write to the console, which reads
		// them).
		if !w.writing && w.h2 {
			w.writing = true
			w.wait()
			if w.c.writing.Add(1) > PreAuthRequests {
				w.refuse()
				return true
			}
		}
		return false
	case w.over:
		w.refuse()
		return true
	}
	return false
}

// refuse closes an unauthenticated connection (everything on it is
// freed at once); on a bound one, it resets the request's stream.
func (w *preAuthWriter) refuse() {
	w.refused = true
	if !w.c.bound.Load() {
		w.c.cut()
		return
	}
	// A deadline in the past: HTTP/2 resets the stream at once (HTTP/1.1
	// carries one request at a time and never gets here).
	_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Unix(1, 0))
}

func (w *preAuthWriter) WriteHeader(code int) {
	w.discardBody()
	if !w.cuts() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *preAuthWriter) Write(p []byte) (int, error) {
	w.discardBody()
	if w.cuts() {
		return 0, errPreAuthCut
	}
	return w.ResponseWriter.Write(p)
}

// Flush is http.Flusher, which Connect requires of a stream's writer.
func (w *preAuthWriter) Flush() { _ = w.FlushError() }

func (w *preAuthWriter) FlushError() error {
	w.discardBody()
	if w.cuts() {
		return errPreAuthCut
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets an http.ResponseController reach the stream.
func (w *preAuthWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// cut closes c at once, freeing its place and everything on it.
func (c *limitedConn) cut() {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	_ = c.Conn.Close()
}

// MaxFrameBytes is the largest HTTP/2 frame the server advertises and
// reads (HTTP/2's initial value, the least a server may take). Go's
// default, a megabyte, let nine bytes — a frame's header declaring that
// length — make the server allocate the frame's whole payload before a
// byte of it arrived, a buffer each connection keeps for its life: a
// megabyte a connection without a credential, 10 GB over the default cap.
// A request's body and headers come in frames of this size or
// CONTINUATIONs; no client sends larger ones unasked.
const MaxFrameBytes = 16 << 10

// MaxReceiveBufferBytes is how far the server reads a connection's
// request bodies ahead of its handlers, over all its streams: HTTP/2's
// connection flow-control window, and each stream's. A body its handler
// does not read — that of a call refused from its headers, whose refusal
// the client does not take — stays in the server's buffers until the
// stream ends, up to the write deadline: at Go's default, a megabyte a
// connection, which a client without a credential could park on each
// connection it opened (10 GB over the default cap). The least HTTP/2
// allows a connection is 64 KiB; a larger body takes a round trip per
// 64 KiB to arrive (a request of the default 1 MiB limit, sixteen).
const MaxReceiveBufferBytes = 64 << 10

// MaxStreamHeaderBytes and MaxStreamHeaderFields bound the request headers
// of a stream (streamsUnbounded), counted as HTTP/2 counts a header list:
// each field's name and value and 32 bytes. A stream keeps its headers
// decoded while it lives — days, for a session or a feed — a map entry a
// field: 1,500 small fields, within ConnLimits.MaxHeaderBytes (64 KiB)
// and some 10 KB on the wire, held 139 KB of the server's heap a stream,
// over the streams a lineage may hold (its share, 5,000 by default, and
// four per node) a gigabyte and more. A credential is at most 8 KiB
// (auth.MaxTokenBytes); an honest stream's other headers (Connect's or
// gRPC's, a trace context, a proxy's) are a few hundred bytes in a dozen
// or two fields. A unary call is bounded by ConnLimits.MaxHeaderBytes
// alone: it ends within its read and write timeouts.
const (
	MaxStreamHeaderBytes  = 16 << 10
	MaxStreamHeaderFields = 100
)

// headerList is the size of h as HTTP/2 counts a header list, and its
// fields (each value of a name is a field).
func headerList(h http.Header) (size, fields int) {
	for name, values := range h {
		for _, v := range values {
			size += len(name) + len(v) + 32
		}
		fields += len(values)
	}
	return size, fields
}
