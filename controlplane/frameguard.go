package controlplane

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// MaxUnansweredPings bounds the PING frames an HTTP/2 peer may have sent
// whose acknowledgements the server has not written yet:
// past it, the server reads nothing more from the connection until its
// writes catch up (each acknowledgement written makes room for one more).
//
// Go's HTTP/2 server queues each acknowledgement as an unsent control
// frame when its writer lags its reader, which it does for a peer sending
// PINGs back to back even when the peer reads every ACK, and the queue
// keeps its largest size for the connection's life: 9,900 PINGs (168 KB
// sent) left some 330 KiB of heap a connection until it closed, on every
// connection anyone may open (thirty-first pass; net/http closes a
// connection only when ten thousand control frames wait, and has no knob
// below that). An honest client has one or two pings out at a time.
// (SETTINGS frames need no bound: the server acknowledges those waiting
// with one ACK.)
const MaxUnansweredPings = 64

// guardHTTP2 has srv serve each HTTP/2 connection through a frameGuard,
// over TLS and in cleartext. It must be called before srv serves, with
// srv's Protocols and TLSConfig set: it has net/http install its HTTP/2
// server (by serving a listener that fails at once, the only way net/http
// offers to do so without serving) and wraps what it installed.
func guardHTTP2(srv *http.Server) error {
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
		serve(hs, handOff(newFrameGuard(nc.UnencryptedNetConn())), h)
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
		serve(hs, handOff(&tlsFrameGuard{newFrameGuard(c), c}), h)
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
// server. It counts the PING frames read (their ACK flag unset) and the
// acknowledgements written, and while MaxUnansweredPings
// of them are unanswered it hands the server no more of what the peer
// sent: the server's queue of unsent acknowledgements stays that short.
// A peer that reads nothing leaves the writes stuck, and the connection is
// closed by the server's write timeout (WriteByteTimeout), which wakes a
// read waiting here.
type frameGuard struct {
	net.Conn

	mu      sync.Mutex
	room    sync.Cond
	owed    int
	closed  bool
	in, out frameScanner // in: under readMu
	held    []byte       // read from the peer, not yet handed on
	heldErr error
	readMu  sync.Mutex
}

func newFrameGuard(c net.Conn) *frameGuard {
	g := &frameGuard{Conn: c}
	g.room.L = &g.mu
	g.out.out = true
	return g
}

func (g *frameGuard) Read(p []byte) (int, error) {
	g.readMu.Lock()
	defer g.readMu.Unlock()
	g.mu.Lock()
	for g.owed >= MaxUnansweredPings && !g.closed {
		g.room.Wait()
	}
	closed, room := g.closed, MaxUnansweredPings-g.owed
	g.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
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
	// Hand on up to the end of the frame that fills the room; keep the rest.
	k, asked := g.in.scan(p[:n], room)
	if k < n {
		g.held = append(bytes.Clone(p[k:n]), g.held...)
		if err != nil {
			g.heldErr, err = err, nil
		}
	}
	if asked > 0 {
		g.mu.Lock()
		g.owed += asked
		g.mu.Unlock()
	}
	return k, err
}

func (g *frameGuard) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	g.mu.Lock()
	_, acks := g.out.scan(p[:n], -1)
	if acks > 0 {
		g.owed = max(0, g.owed-acks)
		g.room.Broadcast()
	}
	g.mu.Unlock()
	return n, err
}

func (g *frameGuard) Close() error {
	g.mu.Lock()
	g.closed = true
	g.room.Broadcast()
	g.mu.Unlock()
	return g.Conn.Close()
}

// frameScanner follows the frames in one direction of a connection, as
// its bytes pass (the 9-byte header of each, its payload skipped).
type frameScanner struct {
	hdr  [9]byte
	n    int // header bytes seen
	left int // payload bytes still to pass
	// counted: the frame whose payload is passing is a PING,
	// unacknowledged in (a request) or an acknowledgement out.
	counted bool
	out     bool
}

const (
	framePing = 0x6
	flagAck   = 0x1
)

// scan passes p and returns how much of it to hand on and how many counted
// frames ended in it: all of p, unless limit (>0) counted frames end
// before its end, then up to the end of the limit-th.
func (s *frameScanner) scan(p []byte, limit int) (int, int) {
	counted := 0
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
			typ, ack := s.hdr[3], s.hdr[4]&flagAck != 0
			s.counted = typ == framePing && ack == s.out
		}
		c := min(s.left, len(p)-i)
		s.left -= c
		i += c
		if s.left > 0 {
			break
		}
		s.n = 0
		if s.counted {
			s.counted = false
			counted++
			if counted == limit {
				return i, counted
			}
		}
	}
	return i, counted
}
