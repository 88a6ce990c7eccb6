package controlplane

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// recordingConn records what a frame guard writes to its connection and
// the write deadlines it sets; with fail set its writes fail.
type recordingConn struct {
	net.Conn  // nil: only the methods below are called
	writes    [][]byte
	deadlines []time.Time
	fail      bool
	closed    bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.fail {
		return 0, errors.New("the peer took nothing")
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordingConn) SetWriteDeadline(t time.Time) error {
	c.deadlines = append(c.deadlines, t)
	return nil
}

func (c *recordingConn) Close() error { c.closed = true; return nil }

// answerFrames are the frames Go's HTTP/2 server writes for a unary
// answer on stream: its HEADERS (flags as given) and its DATA.
func answerFrames(t *testing.T, stream uint32, endHeaders, endStream bool) (headers, data []byte) {
	t.Helper()
	var block bytes.Buffer
	if err := hpack.NewEncoder(&block).WriteField(hpack.HeaderField{Name: ":status", Value: "200"}); err != nil {
		t.Fatal(err)
	}
	var h, d bytes.Buffer
	if err := http2.NewFramer(&h, nil).WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block.Bytes(), EndHeaders: endHeaders, EndStream: endStream}); err != nil {
		t.Fatal(err)
	}
	if err := http2.NewFramer(&d, nil).WriteData(stream, true, []byte("the answer")); err != nil {
		t.Fatal(err)
	}
	return h.Bytes(), d.Bytes()
}

// TestRogue48HKeptHeadersNeverWaitForAWriteThatDoesNotCome: the guard
// keeps a write of HEADERS frames alone only while an answer whose
// handler returned is still to be written (answerComing), and sends it
// with the next write. Every other write goes at once: HEADERS with no
// answer announced (a stream's headers, flushed before its messages),
// HEADERS that end their stream or whose block goes on in CONTINUATION
// frames, anything else. An answer whose stream closes without a write
// (its client reset it) sends what was kept, under the server's write
// bound, and restores the server's deadline; a kept write the peer does
// not take closes the connection.
func TestRogue48HKeptHeadersNeverWaitForAWriteThatDoesNotCome(t *testing.T) {
	headers, data := answerFrames(t, 1, true, false)
	write := func(g *frameGuard, p []byte) {
		t.Helper()
		if n, err := g.Write(p); err != nil || n != len(p) {
			t.Fatalf("write: %d, %v", n, err)
		}
	}

	t.Run("kept for its DATA", func(t *testing.T) {
		c := &recordingConn{}
		g := newFrameGuard(c, frameLimits{})
		g.answerComing()
		write(g, headers)
		if len(c.writes) != 0 {
			t.Fatalf("the announced answer's HEADERS were written alone: %d writes", len(c.writes))
		}
		write(g, data)
		if want := slices.Concat(headers, data); len(c.writes) != 1 || !bytes.Equal(c.writes[0], want) {
			t.Fatalf("writes %q, want one of HEADERS and DATA %q", c.writes, want)
		}
		g.answerDone()
		if len(c.writes) != 1 {
			t.Fatalf("the answer's end wrote again: %q", c.writes)
		}
	})

	t.Run("written at once", func(t *testing.T) {
		endStream, _ := answerFrames(t, 3, true, true)
		continued, _ := answerFrames(t, 5, false, false)
		for name, tc := range map[string]struct {
			announced bool
			p         []byte
		}{
			"HEADERS, no answer announced": {false, headers},
			"HEADERS ending their stream":  {true, endStream},
			"a header block that goes on":  {true, continued},
			"DATA":                         {true, data},
			"HEADERS and DATA":             {true, slices.Concat(headers, data)},
			"part of a frame":              {true, headers[:5]},
		} {
			c := &recordingConn{}
			g := newFrameGuard(c, frameLimits{})
			if tc.announced {
				g.answerComing()
			}
			write(g, tc.p)
			if len(c.writes) != 1 || !bytes.Equal(c.writes[0], tc.p) {
				t.Errorf("%s: writes %q, want %q at once", name, c.writes, tc.p)
			}
		}
	})

	t.Run("sent when its answer's stream closes", func(t *testing.T) {
		c := &recordingConn{}
		g := newFrameGuard(c, frameLimits{byteTimeout: time.Minute})
		server := time.Unix(1_000_000, 0)
		_ = g.SetWriteDeadline(server)
		g.answerComing() // an answer its client resets before it is written
		g.answerComing()
		write(g, headers) // another stream's HEADERS, kept
		g.answerDone()
		if len(c.writes) != 0 {
			t.Fatalf("kept HEADERS written while an announced answer is still to be written: %q", c.writes)
		}
		g.answerDone()
		if len(c.writes) != 1 || !bytes.Equal(c.writes[0], headers) {
			t.Fatalf("writes %q once no announced answer is left, want the kept HEADERS %q", c.writes, headers)
		}
		// The guard's write bounded (server's, the guard's, the server's again).
		if n := len(c.deadlines); n != 3 || !c.deadlines[0].Equal(server) || !c.deadlines[1].After(server) || !c.deadlines[2].Equal(server) {
			t.Fatalf("write deadlines %v, want the server's %v, a bound of the guard's, the server's again", c.deadlines, server)
		}
		write(g, data)
		if len(c.writes) != 2 || !bytes.Equal(c.writes[1], data) {
			t.Fatalf("the next write %q, want %q alone", c.writes[1:], data)
		}
	})

	t.Run("a kept write the peer does not take", func(t *testing.T) {
		c := &recordingConn{}
		g := newFrameGuard(c, frameLimits{byteTimeout: time.Minute})
		g.answerComing()
		write(g, headers)
		c.fail = true
		g.answerDone()
		if !c.closed {
			t.Fatal("the connection stays open after a kept write failed: the server's next frame would follow a cut one")
		}
	})
}
