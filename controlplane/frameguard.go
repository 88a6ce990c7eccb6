package controlplane

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/internal/clock"
)

// MaxFramesAhead bounds the frames of an HTTP/2 peer the server reads
// ahead of its writer: after each MaxFramesAhead frames the guard hands
// the server a PING of its own and reads nothing more from the peer until
// the server has written that PING's acknowledgement, which the guard
// takes out of what the peer is sent.
//
// Go's HTTP/2 server answers some frames with a control frame — a PING
// with its ACK; a PRIORITY making a stream depend on itself, a DATA frame
// on a closed stream, a HEADERS frame it refuses, each with a RST_STREAM
// — queued while its writer lags its reader, which it does for a peer
// sending such frames back to back even when the peer reads every answer,
// and the queue keeps its largest size for the connection's life: 9,900
// of them left 200–350 KiB of heap a connection until it closed, on every
// connection anyone may open (thirty-first, thirty-fourth and
// thirty-fifth passes; net/http closes a connection only when ten thousand
// control frames wait, and has no knob below that). Its queue of control
// frames is first in, first out, so once the guard's acknowledgement is
// written every answer to what the peer sent before it has been, and the
// queue holds at most the answers to MaxFramesAhead frames. An honest
// client's frames pass with a round of the server's loop every
// MaxFramesAhead (a megabyte of a body in frames of MaxFrameBytes, some
// twenty calls). (SETTINGS frames need no bound: the server acknowledges
// those waiting with one ACK.)
const MaxFramesAhead = 64

// guardHTTP2 has srv serve each HTTP/2 connection through a frameGuard,
// over TLS and in cleartext. It must be called before srv serves, with
// srv's Protocols and TLSConfig set: it has net/http install its HTTP/2
// server (by serving a listener that fails at once, the only way net/http
// offers to do so without serving) and wraps what it installed.
//
// Each connection's frames that carry no request's work are charged to a
// frame budget of its own (frameLimits): see ConnLimits.ControlFrames.
func guardHTTP2(srv *http.Server, limits frameLimits) error {
	var err error
	if srv.TLSConfig != nil {
		err = srv.ServeTLS(failingListener{}, "", "")
	} else {
		err = srv.Serve(failingListener{})
		// net/http gave it a TLS configuration to add "h2" to: the
		// server still serves in cleartext.
		srv.TLSConfig = nil
	}
	if !errors.Is(err, errNoAccept) {
		return err
	}
	const h2, cleartext = "h2", "unencrypted_http2" // net/http's TLSNextProto keys
	serve := srv.TLSNextProto[cleartext]
	if serve == nil {
		return errors.New("controlplane: net/http installed no cleartext HTTP/2 server")
	}
	// Cleartext: net/http has read the client's preface and hands the
	// connection over wrapped in a *tls.Conn that is not one.
	srv.TLSNextProto[cleartext] = func(hs *http.Server, c *tls.Conn, h http.Handler) {
		nc, ok := c.NetConn().(interface{ UnencryptedNetConn() net.Conn })
		if !ok {
			_ = c.Close()
			return
		}
		serve(hs, handOff(newFrameGuard(nc.UnencryptedNetConn(), limits)), h)
	}
	if srv.TLSNextProto[h2] == nil {
		return nil // HTTP/2 over TLS not served
	}
	// Over TLS the guard must see the decrypted frames, so the connection
	// is handed to the same server as a cleartext one, its preface read
	// here, the guard answering for its TLS state (a request's TLS field,
	// the cipher suite checks).
	srv.TLSNextProto[h2] = func(hs *http.Server, c *tls.Conn, h http.Handler) {
		wait := hs.ReadHeaderTimeout
		if wait <= 0 {
			wait = 10 * time.Second
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		preface := make([]byte, len(clientPreface))
		if _, err := io.ReadFull(c, preface); err != nil || !bytes.Equal(preface, clientPreface) {
			_ = c.Close()
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		serve(hs, handOff(&tlsFrameGuard{newFrameGuard(c, limits), c}), h)
	}
	return nil
}

var clientPreface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

var errNoAccept = errors.New("controlplane: not accepting")

// failingListener fails its first Accept: guardHTTP2's way to have
// net/http install its HTTP/2 server.
type failingListener struct{}

func (failingListener) Accept() (net.Conn, error) { return nil, errNoAccept }
func (failingListener) Close() error              { return nil }
func (failingListener) Addr() net.Addr            { return &net.TCPAddr{} }

// handOff wraps c as net/http hands a cleartext connection to its HTTP/2
// server.
func handOff(c net.Conn) *tls.Conn { return tls.Client(cleartextConn{conn: c}, nil) }

type cleartextConn struct {
	net.Conn // nil: only UnencryptedNetConn is called
	conn     net.Conn
}

func (c cleartextConn) UnencryptedNetConn() net.Conn { return c.conn }

// tlsFrameGuard is a frameGuard over a TLS connection, with its state.
type tlsFrameGuard struct {
	*frameGuard
	tc *tls.Conn
}

func (g *tlsFrameGuard) ConnectionState() tls.ConnectionState { return g.tc.ConnectionState() }

// frameGuard sits between an HTTP/2 connection's frames and Go's HTTP/2
// server, paces what it reads from the peer by what the server writes
// (MaxFramesAhead), and takes its own PINGs' acknowledgements out of what
// the server writes. A peer that reads nothing leaves the writes stuck,
// and the connection is closed by the server's write timeout
// (WriteByteTimeout), which wakes a read waiting here.
type frameGuard struct {
	net.Conn

	mu      sync.Mutex
	room    sync.Cond
	waiting bool // for the acknowledgement of the guard's PING
	closed  bool
	// budget: the frames the peer may still send that carry no
	// request's work (frameBudget); nil: unbounded.
	budget *frameBudget
	// open: the streams the peer opened (a HEADERS frame without
	// END_STREAM) that neither side has ended since (END_STREAM, or
	// RST_STREAM), at most MaxOpenStreamsFollowed: the streams whose DATA
	// frames carry a request's body, with what their DATA frames cost
	// since the server last gave them window (DataFramesPerWindowUpdate).
	// Kept with the budget.
	open map[uint32]streamFrames

	readMu  sync.Mutex
	in      frameScanner // under readMu
	inject  []byte       // the rest of the guard's PING to hand on
	held    []byte       // read from the peer, not yet handed on
	heldErr error

	writeMu sync.Mutex
	out     ackFilter // under writeMu
	ping    [9 + 8]byte

	// answers: the unary answers on the connection whose handlers have
	// returned (answerComing) and whose streams have not closed
	// (answerDone). While there are any, a write of the server's that is
	// HEADERS frames alone is kept in unsent (under writeMu) and goes out
	// with the next write, in one system call: the HEADERS of an answer
	// and its DATA, which Go's HTTP/2 server flushes apart.
	answers atomic.Int64
	unsent  []byte
	// keeping: set while a write may be kept in unsent (set before
	// answers is read, so that answerDone, which reads it after lowering
	// answers, takes writeMu only when something may be kept).
	keeping atomic.Bool
	// byteTimeout: the server's WriteByteTimeout, the bound on a write of
	// unsent bytes of the guard's own (sendUnsentLocked).
	byteTimeout time.Duration
	// deadline: the write deadline the server last set (SetWriteDeadline),
	// restored after a write of the guard's own; releasing while one is
	// under way. Under dlMu.
	dlMu      sync.Mutex
	deadline  time.Time
	releasing bool
}

// pingAckHeader is the header of a PING acknowledgement.
var pingAckHeader = [9]byte{0, 0, 8, framePing, flagAck}

func newFrameGuard(c net.Conn, limits frameLimits) *frameGuard {
	g := &frameGuard{Conn: c, byteTimeout: limits.byteTimeout}
	g.room.L = &g.mu
	g.ping[2], g.ping[3] = 8, framePing
	_, _ = rand.Read(g.ping[9:])
	g.out.cookie = [8]byte(g.ping[9:])
	if limits.burst > 0 {
		g.budget = &frameBudget{limits: limits, credit: float64(limits.burst), last: limits.clock.Now()}
		g.open = map[uint32]streamFrames{}
		g.in.charge = g.charge
	}
	// The connection's admitted requests earn it frames
	// (limitedConn.earnFrames), and its answers are announced to it
	// (answersBounded).
	if lc := limitedOf(c); lc != nil {
		lc.guard.Store(g)
	}
	return g
}

// frameLimits bound the frames of a connection's peer that carry no
// request's work (ConnLimits.ControlFrames): burst 0 is unbounded.
type frameLimits struct {
	burst int
	rate  float64 // frames a second
	clock clock.Clock
	// throttled counts the connections whose reads wait for their
	// budget now (Server.ThrottledConnections).
	throttled *atomic.Int64
	// byteTimeout is the server's WriteByteTimeout (frameGuard.byteTimeout).
	byteTimeout time.Duration
}

// FramesPerRequest is how many frames carrying no request's work each
// request on a connection that the auth Gate judges (an RPC, admitted and
// charged to its caller's rate budget, or refused on a bound connection;
// a console page earns by the console's calls to the API for it) earns
// the connection's frame
// budget (ConnLimits.ControlFrames): room
// for its stream's HEADERS and reset, its window updates, a header
// block's CONTINUATIONs, a PING or two, many times over. A call refused
// on a connection a call has bound earns as an admitted one does: a
// follower forwarding the calls of a caller whose budget is spent, or a
// client retrying them, is never slowed for them, and each costs the
// server more than the frames it earns. A public endpoint's request earns
// nothing, nor does a console page's own, nor a call refused on a
// connection no call has bound: charged to nobody (a page without a
// session, a refusal past its address's budget), until the forty-eighth
// pass each earned its sender the frames of the next sixteen (rogue48g
// tests).
const FramesPerRequest = 16

// frameBudget is a connection's budget of frames that carry no request's
// work — every frame but a DATA frame with a payload (not padded) on a
// stream the peer opened and neither side has ended, each HEADERS and
// CONTINUATION frame among them — of which the peer may send
// ControlFrames ahead. It refills by what the connection carries — each
// request on it the auth Gate judges (FramesPerRequest), each frame the
// server sends that its peer answers (a PING, a SETTINGS), each DATA frame
// of its answers of a KiB or more and each KiB of smaller ones together (a
// window update, EarnedDataBytes) — and by ControlFrameRate a second, up
// to ControlFrames. A connection that has spent it is read no
// further until it refills: slowed, never closed by it, so that a client
// misjudged loses time, not its calls. Under g.mu.
type frameBudget struct {
	limits frameLimits
	credit float64
	last   time.Time
	timer  clock.Timer // armed while a read waits for the budget
	// since: when a read first waited for the budget after it was last
	// full; zero: it has been full since.
	since time.Time
}

// MaxThrottled is how long a connection's reads may keep waiting for its
// frame budget (ConnLimits.ControlFrames) before it is closed: from the
// first wait after the budget was last full, a peer still sending past
// what it earns is closed, its own calls with it. Slowed, a peer that
// sends its frames back to back keeps the server's receive buffer of the
// connection full of them (and, gone, its connection open until it is
// read to its end at ControlFrameRate); an honest client past its budget
// for a moment is read again at once, and refilled before it could be
// closed.
const MaxThrottled = 30 * time.Second

// refill adds what time earned since last, up to the burst.
func (b *frameBudget) refill() {
	now := b.limits.clock.Now()
	if d := now.Sub(b.last); d > 0 {
		b.credit = min(float64(b.limits.burst), b.credit+d.Seconds()*b.limits.rate)
	}
	b.last = now
	b.fullLocked()
}

// fullLocked ends an episode of throttling once the budget is full again.
func (b *frameBudget) fullLocked() {
	if b.credit >= float64(b.limits.burst) {
		b.since = time.Time{}
	}
}

// overdrawnLocked notes a read waiting for the budget, and reports
// whether reads have waited for it since MaxThrottled ago or more.
func (b *frameBudget) overdrawnLocked() bool {
	now := b.limits.clock.Now()
	if b.since.IsZero() {
		b.since = now
		return false
	}
	return now.Sub(b.since) >= MaxThrottled
}

// MaxOpenStreamsFollowed bounds the streams a connection's frame guard
// follows as open (frameGuard.open): four times what a connection may
// carry at once by default (ConnLimits.MaxStreamsPerConn); a stream
// opened past it has its body's DATA frames charged as frames.
const MaxOpenStreamsFollowed = 1024

// DataFramesPerWindowUpdate is how many DATA frames carrying a payload a
// stream the peer opened may send free (its bytes a request's body,
// charged by their size) since the server last gave the stream window —
// a WINDOW_UPDATE on it, which Go's HTTP/2 server sends once the stream's
// handler has read some 4 KiB of its body, or what is left of its
// window. Each frame past them costs the connection's frame budget
// (ConnLimits.ControlFrames) one, given back with the stream's next
// window. A body nobody reads — that of a call refused from its headers,
// whose refusal its sender does not take — is dropped as it comes, its
// stream's window (MaxReceiveBufferBytes) never given back: until the
// forty-first pass each of its frames was free, a refusal (which earns
// FramesPerRequest) earning its sender 65,536 frames of a byte. An honest
// body's frames average far more than 4 KiB / DataFramesPerWindowUpdate
// (16 bytes) each: a message's envelope and its protobuf, or frames of
// MaxFrameBytes.
const DataFramesPerWindowUpdate = 256

// streamFrames is what a followed stream's DATA frames cost since the
// server last gave it window: unpaid, the frames carrying a payload
// taken free; charged, those charged to the budget past
// DataFramesPerWindowUpdate, given back with the stream's next window.
type streamFrames struct {
	unpaid, charged uint32
}

// streamOf is the stream a frame's header names.
func streamOf(hdr []byte) uint32 {
	return uint32(hdr[5]&0x7f)<<24 | uint32(hdr[6])<<16 | uint32(hdr[7])<<8 | uint32(hdr[8])
}

// costLocked is what a frame the peer sent costs the budget, from its
// header: nothing for a DATA frame carrying a payload on a stream the
// peer opened and neither side has ended (its bytes are a request's body,
// charged by their size) within DataFramesPerWindowUpdate since the
// server last gave the stream window, one for any other — a DATA frame on
// a stream already ended or reset among them: its bytes are nobody's
// body, and Go's HTTP/2 server answers each with a RST_STREAM. It follows
// the streams the peer opens and ends (g.open). g.mu is held.
func (g *frameGuard) costLocked(hdr *[9]byte) float64 {
	length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	id, endStream := streamOf(hdr[:]), hdr[4]&flagEndStream != 0
	cost := 1.0
	switch hdr[3] {
	case frameHeaders:
		if _, open := g.open[id]; !open && !endStream && len(g.open) < MaxOpenStreamsFollowed {
			g.open[id] = streamFrames{}
		} else if endStream {
			delete(g.open, id)
		}
	case frameData:
		if st, open := g.open[id]; open && length > 0 && hdr[4]&flagPadded == 0 {
			if st.unpaid < DataFramesPerWindowUpdate {
				st.unpaid++
				cost = 0
			} else {
				st.charged++
			}
			g.open[id] = st
		}
		if endStream {
			delete(g.open, id)
		}
	case frameRSTStream:
		delete(g.open, id)
	}
	return cost
}

// ended notes streams the server ended (its END_STREAM or RST_STREAM):
// the peer's DATA frames on them carry no request's body any more.
func (g *frameGuard) ended(ids []uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range ids {
		delete(g.open, id)
	}
}

// windowed notes streams the server gave window (a WINDOW_UPDATE on
// each): their handlers are reading their bodies, so their next
// DataFramesPerWindowUpdate DATA frames are free again, and those charged
// since their last window are given back.
func (g *frameGuard) windowed(ids []uint32) {
	back := 0
	g.mu.Lock()
	for _, id := range ids {
		if st, open := g.open[id]; open {
			back += int(st.charged)
			g.open[id] = streamFrames{}
		}
	}
	g.mu.Unlock()
	g.earn(back)
}

// charge takes a frame the peer sent out of the budget, and reports
// whether it is spent (the reads stop at the frame's end).
func (g *frameGuard) charge(hdr *[9]byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	cost := g.costLocked(hdr)
	if cost == 0 {
		return false
	}
	b := g.budget
	b.refill()
	b.credit -= cost
	return b.credit < 0
}

// earn adds n frames to the budget, up to the burst, and wakes a read
// waiting for it.
func (g *frameGuard) earn(n int) {
	if n <= 0 || g.budget == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.budget
	b.refill()
	was := b.credit
	b.credit = min(float64(b.limits.burst), b.credit+float64(n))
	b.fullLocked()
	if was < 0 && b.credit >= 0 {
		g.room.Broadcast()
	}
}

// spentLocked reports whether the budget is spent, arming the timer that
// wakes the reads once time has refilled it. g.mu is held.
func (g *frameGuard) spentLocked() bool {
	b := g.budget
	if b == nil {
		return false
	}
	b.refill()
	if b.credit >= 0 {
		return false
	}
	if b.timer == nil && b.limits.rate > 0 {
		wait := time.Duration(-b.credit / b.limits.rate * float64(time.Second))
		b.timer = b.limits.clock.AfterFunc(max(wait, time.Millisecond), func() {
			g.mu.Lock()
			b.timer = nil
			g.room.Broadcast()
			g.mu.Unlock()
		})
	}
	return true
}

func (g *frameGuard) Read(p []byte) (int, error) {
	g.readMu.Lock()
	defer g.readMu.Unlock()
	g.mu.Lock()
	throttled := false
	for !g.closed {
		if g.waiting {
			g.room.Wait()
			continue
		}
		if len(g.inject) == 0 && g.spentLocked() {
			if g.budget.overdrawnLocked() {
				// Still sending past its budget MaxThrottled after it
				// was first slowed: closed (its own calls with it).
				g.closeLocked()
				break
			}
			if !throttled {
				throttled = true
				g.budget.limits.throttled.Add(1)
			}
			g.room.Wait()
			continue
		}
		break
	}
	if throttled {
		g.budget.limits.throttled.Add(-1)
	}
	closed := g.closed
	g.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	if len(g.inject) > 0 {
		n := copy(p, g.inject)
		g.inject = g.inject[n:]
		if len(g.inject) == 0 {
			g.inject = nil
			g.mu.Lock()
			g.waiting = true
			g.mu.Unlock()
		}
		return n, nil
	}
	var n int
	var err error
	if len(g.held) > 0 {
		n = copy(p, g.held)
		g.held = g.held[n:]
		if len(g.held) == 0 {
			g.held = nil
		}
	} else if g.heldErr != nil {
		return 0, g.heldErr
	} else {
		n, err = g.Conn.Read(p)
	}
	// Hand on up to the end of the frame that fills the room; keep the
	// rest, and hand on the guard's PING next.
	k, due := g.in.scan(p[:n], MaxFramesAhead)
	if k < n {
		g.held = append(bytes.Clone(p[k:n]), g.held...)
		if err != nil {
			g.heldErr, err = err, nil
		}
	}
	if due {
		g.inject = g.ping[:]
	}
	return k, err
}

func (g *frameGuard) Write(p []byte) (int, error) {
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	whole := g.out.atFrame()
	out, acks := g.out.filter(p)
	switch {
	case len(g.unsent) > 0:
		out = append(g.unsent, out...)
		g.unsent = nil
		g.keeping.Store(false)
	case whole && g.out.atFrame() && headersAlone(out):
		g.keeping.Store(true)
		if g.answers.Load() > 0 {
			// An answer's HEADERS: its DATA follows, and takes them along.
			g.unsent = append(make([]byte, 0, len(out)+unsentRoom), out...)
			out = nil
		} else {
			g.keeping.Store(false)
		}
	}
	if len(out) > 0 {
		if _, err := g.Conn.Write(out); err != nil {
			return 0, err
		}
	}
	if earned := g.out.earned; earned > 0 {
		g.out.earned = 0
		g.earn(earned)
	}
	if len(g.out.ended) > 0 {
		if g.budget != nil {
			g.ended(g.out.ended)
		}
		g.out.ended = g.out.ended[:0]
	}
	if len(g.out.windowed) > 0 {
		if g.budget != nil {
			g.windowed(g.out.windowed)
		}
		g.out.windowed = g.out.windowed[:0]
	}
	if acks > 0 {
		g.mu.Lock()
		g.waiting = false
		g.room.Broadcast()
		g.mu.Unlock()
	}
	return len(p), nil
}

// unsentRoom is the room a kept write of HEADERS frames (frameGuard.unsent)
// is given for the write that takes it along: a unary answer's DATA frame.
const unsentRoom = 512

// headersAlone reports whether p is one or more whole HEADERS frames, each
// ending its header block and none its stream: the start of answers whose
// DATA, or trailers, are still to be written.
func headersAlone(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for len(p) > 0 {
		if len(p) < 9 || p[3] != frameHeaders || p[4]&(flagEndStream|flagEndHeaders) != flagEndHeaders {
			return false
		}
		n := 9 + (int(p[0])<<16 | int(p[1])<<8 | int(p[2]))
		if n > len(p) {
			return false
		}
		p = p[n:]
	}
	return true
}

// answerComing announces a unary answer on the connection whose handler
// has returned: Go's HTTP/2 server writes what is left of it (its HEADERS,
// then its DATA) or its stream closes. answerDone must follow once its
// stream has closed.
func (g *frameGuard) answerComing() { g.answers.Add(1) }

// answerDone notes that an announced answer's stream closed. When no
// announced answer is left, HEADERS kept for a write that will not come
// (an answer whose stream its client reset before it was written) are
// written now.
func (g *frameGuard) answerDone() {
	if g.answers.Add(-1) > 0 || !g.keeping.Load() {
		return
	}
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	if len(g.unsent) > 0 && g.answers.Load() == 0 {
		g.sendUnsentLocked()
	}
}

// sendUnsentLocked writes the kept HEADERS frames, bounded as the server
// bounds its own writes (byteTimeout), its own deadline restored after. A
// write that fails closes the connection: the server's frames after it
// would follow a cut frame. g.writeMu is held.
func (g *frameGuard) sendUnsentLocked() {
	g.dlMu.Lock()
	g.releasing = true
	if g.byteTimeout > 0 {
		_ = g.Conn.SetWriteDeadline(time.Now().Add(g.byteTimeout))
	}
	g.dlMu.Unlock()
	_, err := g.Conn.Write(g.unsent)
	g.unsent = nil
	g.keeping.Store(false)
	g.dlMu.Lock()
	g.releasing = false
	_ = g.Conn.SetWriteDeadline(g.deadline)
	g.dlMu.Unlock()
	if err != nil {
		_ = g.Conn.Close()
	}
}

// SetWriteDeadline is the server's deadline for its writes, kept to be
// restored after a write of the guard's own (sendUnsentLocked).
func (g *frameGuard) SetWriteDeadline(t time.Time) error {
	g.dlMu.Lock()
	defer g.dlMu.Unlock()
	g.deadline = t
	if g.releasing {
		return nil
	}
	return g.Conn.SetWriteDeadline(t)
}

func (g *frameGuard) Close() error {
	g.mu.Lock()
	g.closeLocked()
	g.mu.Unlock()
	return g.Conn.Close()
}

// closeLocked marks g closed and wakes its reads. g.mu is held; the
// connection itself is closed by the caller, or by its read that returns
// net.ErrClosed to the server, which closes it.
func (g *frameGuard) closeLocked() {
	g.closed = true
	g.room.Broadcast()
	if g.budget != nil && g.budget.timer != nil {
		g.budget.timer.Stop()
		g.budget.timer = nil
	}
}

// frameScanner follows the frames the peer sends, as their bytes pass
// (the 9-byte header of each, its payload skipped).
type frameScanner struct {
	hdr    [9]byte
	n      int // header bytes seen
	left   int // payload bytes still to pass
	frames int // frames ended since the last cut
	// block: a header block is open (a HEADERS or PUSH_PROMISE frame
	// without END_HEADERS, until the CONTINUATION that ends it); no other
	// frame may come between its frames.
	block bool
	// charge, when set, is called with each frame's header and reports
	// whether the frame budget is spent: the scan then stops at the
	// frame's end (spent), inside a header block too (stopping the reads
	// puts nothing between its frames).
	charge func(hdr *[9]byte) bool
	spent  bool
}

const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	framePushPromise  = 0x5
	frameSettings     = 0x4
	framePing         = 0x6
	frameWindowUpdate = 0x8
	frameContinuation = 0x9
	flagAck           = 0x1
	flagEndStream     = 0x1
	flagEndHeaders    = 0x4
	flagPadded        = 0x8
)

// scan passes p and returns how much of it to hand on, and whether a cut
// is due there: all of p, unless limit frames have ended since the last
// cut before its end, then up to the end of the first frame from the
// limit-th on that ends outside a header block.
func (s *frameScanner) scan(p []byte, limit int) (int, bool) {
	i := 0
	for i < len(p) {
		if s.n < len(s.hdr) {
			c := copy(s.hdr[s.n:], p[i:])
			s.n += c
			i += c
			if s.n < len(s.hdr) {
				break
			}
			s.left = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
			switch typ, end := s.hdr[3], s.hdr[4]&flagEndHeaders != 0; typ {
			case frameHeaders, framePushPromise, frameContinuation:
				s.block = !end
			}
			if s.charge != nil && s.charge(&s.hdr) {
				s.spent = true
			}
		}
		c := min(s.left, len(p)-i)
		s.left -= c
		i += c
		if s.left > 0 {
			break
		}
		s.n = 0
		s.frames++
		if s.frames >= limit && !s.block {
			s.frames = 0
			s.spent = false
			return i, true
		}
		if s.spent {
			s.spent = false
			return i, false
		}
	}
	return i, false
}

// ackFilter follows the frames the server writes and takes out the
// acknowledgements of the guard's PINGs (those carrying cookie). A frame
// whose first bytes could begin such an acknowledgement, split across
// writes, is held over until its bytes show whether it is one: the rest
// of a frame the server began to write follows in its next write.
type ackFilter struct {
	cookie [8]byte
	n      int  // bytes seen of the frame's header (and, held, its payload)
	left   int  // payload bytes still to pass
	hold   bool // the frame's bytes so far may begin an acknowledgement
	// carried: the held bytes began in an earlier write and are not
	// written yet.
	carried bool
	buf     [9 + 8]byte // the frame's header (and, held, its payload)
	// earned: the frames the peer may send in answer to what passed
	// (earns), for the frame budget.
	earned int
	// smallData: the bytes of the DATA frames under EarnedDataBytes that
	// passed and have not earned a frame yet (earns).
	smallData int
	// ended: the streams the frames that passed ended (END_STREAM,
	// RST_STREAM), for the frame budget (frameGuard.ended).
	ended []uint32
	// windowed: the streams the frames that passed gave window
	// (WINDOW_UPDATE), for the frame budget (frameGuard.windowed).
	windowed []uint32
}

// atFrame reports whether the filter is between frames: the next byte
// written begins a frame's header.
func (f *ackFilter) atFrame() bool { return f.n == 0 && f.left == 0 && !f.hold }

// saw notes a frame the server writes, from its header: what it earns,
// the stream it ends, and the stream it gives window.
func (f *ackFilter) saw(hdr []byte) {
	f.earned += f.earns(hdr)
	switch hdr[3] {
	case frameData, frameHeaders:
		if hdr[4]&flagEndStream != 0 {
			f.ended = append(f.ended, streamOf(hdr))
		}
	case frameRSTStream:
		f.ended = append(f.ended, streamOf(hdr))
	case frameWindowUpdate:
		if id := streamOf(hdr); id != 0 {
			f.windowed = append(f.windowed, id)
		}
	}
}

// EarnedDataBytes is how many bytes of the DATA frames the server writes
// earn their peer's frame budget (ConnLimits.ControlFrames) one frame:
// the window updates the peer sends for them. A DATA frame of at least
// EarnedDataBytes earns one; smaller ones earn one for each
// EarnedDataBytes of them together, on the connection. Until the
// forty-second pass a frame under a KiB earned nothing, and an honest
// client receiving many small answers on a stream (renews on a lease
// Channel, a watch's messages) spent its connection's budget on the
// window updates they drew (Go's HTTP/2 client sends one for the
// connection and one for the stream every 4 KiB it reads): 2,000 renews
// pipelined on one Channel left its connection read no further, its next
// call waiting for the budget to refill by time. A peer earns no more a
// byte than before: a frame the server writes, of whatever size, costs
// the server more than the frame it earns, and its bytes are the peer's
// to take (its window).
const EarnedDataBytes = 1 << 10

// earns is what a frame the server writes earns its peer's frame budget:
// one for a PING or SETTINGS of the server's own (the peer acknowledges
// it); one for a DATA frame of at least EarnedDataBytes, and one for each
// EarnedDataBytes of smaller ones together (the peer's window updates).
func (f *ackFilter) earns(hdr []byte) int {
	length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	switch {
	case hdr[3] == frameData && length >= EarnedDataBytes,
		(hdr[3] == framePing || hdr[3] == frameSettings) && hdr[4]&flagAck == 0:
		return 1
	case hdr[3] == frameData:
		f.smallData += length
		n := f.smallData / EarnedDataBytes
		f.smallData %= EarnedDataBytes
		return n
	}
	return 0
}

// filter returns what of p to write (p itself when nothing is taken out
// or held over) and how many of the guard's acknowledgements it took out.
func (f *ackFilter) filter(p []byte) ([]byte, int) {
	var out []byte
	changed := false // out holds what is written; else it is p[:i]
	pass := func(from, to int) {
		if changed {
			out = append(out, p[from:to]...)
		}
	}
	// change: what is written differs from p from p[at] on.
	change := func(at int) {
		if !changed {
			changed = true
			out = append(make([]byte, 0, len(p)+len(f.buf)), p[:at]...)
		}
	}
	length := func() int { return int(f.buf[0])<<16 | int(f.buf[1])<<8 | int(f.buf[2]) }
	acks, start, i := 0, 0, 0 // start: where the held frame began in p
	for i < len(p) {
		if f.left > 0 {
			c := min(f.left, len(p)-i)
			pass(i, i+c)
			f.left -= c
			i += c
			continue
		}
		if f.n == 0 && !f.hold {
			f.hold, start = true, i
		}
		if !f.hold {
			// The rest of the header of a frame that is no acknowledgement.
			c := min(len(pingAckHeader)-f.n, len(p)-i)
			copy(f.buf[f.n:], p[i:i+c])
			pass(i, i+c)
			f.n += c
			i += c
			if f.n == len(pingAckHeader) {
				f.saw(f.buf[:])
				f.left, f.n = length(), 0
			}
			continue
		}
		b := p[i]
		f.buf[f.n] = b
		f.n++
		i++
		if f.n <= len(pingAckHeader) && b != pingAckHeader[f.n-1] {
			// No acknowledgement: what was held is written.
			if f.carried {
				change(start)
				out = append(out, f.buf[:f.n]...)
			} else {
				pass(start, i)
			}
			f.hold, f.carried = false, false
			if f.n == len(pingAckHeader) {
				f.saw(f.buf[:])
				f.left, f.n = length(), 0
			}
			continue
		}
		if f.n < len(f.buf) {
			continue
		}
		switch {
		case [8]byte(f.buf[len(pingAckHeader):]) == f.cookie:
			acks++
			change(start)
		case f.carried:
			change(start)
			out = append(out, f.buf[:]...)
		default:
			pass(start, i)
		}
		f.n, f.hold, f.carried = 0, false, false
	}
	if f.hold && f.n > 0 {
		change(start)
		f.carried = true
	}
	if !changed {
		return p, acks
	}
	return out, acks
}
