package controlplane

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"golang.org/x/net/http2"
)

// A follower relays a lease Channel it forwards to the leader (forward.go)
// by reading the leader's answers and writing each to the caller: while
// the caller takes none of them (it grants no flow-control window), the
// relay waits on its write and reads no more. What the leader sends
// meanwhile waits in the follower's HTTP/2 client for the relay, as far
// as the window that client grants the leader's stream: Go's default,
// 4 MiB a stream. A rogue agent that opened Channels through a follower
// on connections of its own, sent renews (each answered, each charged to
// its budget as any call) and read nothing had the follower hold the
// leader's answers for them — measured with Go's own client, some 1.1 MB
// a Channel of 4,400 renews; up to the window — over the streams its
// lineage may hold (--max-streams-per-lineage, 5,000 by default), on a
// replica that holds them for every lineage's forwarded calls. The
// follower's client now grants each stream of the leader's answers
// MaxReceiveBufferBytes, as the server grants a request's body: the rest
// waits in the leader's own bound of answers in flight
// (maxChannelInFlight), as it does for a Channel opened to the leader
// itself. Measured on the wire: the settings the follower's client sends
// the leader as it connects. The connection's window stays larger than
// its streams' together, so that one caller's unread answers do not stall
// the others' forwarded calls.
func TestRogue44GBAFollowerHoldsAtMostAWindowOfTheLeadersAnswersAStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type seen struct {
		stream, conn uint32
		err          error
	}
	got := make(chan seen, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- seen{err: err}
			return
		}
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			got <- seen{err: err}
			return
		}
		// HTTP/2's initial windows, until the client's settings or
		// window updates say otherwise.
		s := seen{stream: 65535, conn: 65535}
		fr := http2.NewFramer(io.Discard, c)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				got <- seen{err: err}
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					s.stream = v
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					s.conn += f.Increment
				}
			case *http2.HeadersFrame:
				got <- s
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := peerClient(nil)
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String()+"/tether.v1.LeaseService/Channel", nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	s := <-got
	if s.err != nil {
		t.Fatal(s.err)
	}
	t.Logf("the follower's client lets the leader send %d bytes ahead on a stream, %d on the connection", s.stream, s.conn)
	if s.stream > MaxReceiveBufferBytes {
		t.Errorf("the follower's client lets the leader send %d bytes of a stream's answers ahead of the relay, want at most %d", s.stream, MaxReceiveBufferBytes)
	}
	// The connection's window must not bind before the streams' do: one
	// caller's unread Channel would stall every other caller's forwarded
	// calls on the connection.
	if want := uint32(DefaultConnLimits.MaxStreamsPerConn) * s.stream; s.conn < want {
		t.Errorf("the follower's client lets the leader send %d bytes ahead on the connection, fewer than %d streams of %d: one caller's unread answers would stall the others'", s.conn, DefaultConnLimits.MaxStreamsPerConn, s.stream)
	}
}
