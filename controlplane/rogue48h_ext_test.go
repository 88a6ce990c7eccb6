package controlplane_test

import (
	"net"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// countingListener counts the writes to the connections it accepts: the
// server's system calls that send.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestRogue48HAUnaryAnswerIsOneWrite: a unary answer over HTTP/2 goes out
// in one write of the server's. Go's HTTP/2 server flushes an answer's
// HEADERS frame before its handler hands it the DATA (the handler waits
// for the HEADERS to be written), so each answer cost two system calls to
// send, and its client two wake-ups to take; the connection's frame guard
// now keeps the HEADERS of an answer whose handler has returned and sends
// them with its DATA (frameGuard.answerComing). Before: 2 writes an answer
// (100 calls, 200 writes); after: 1.
func TestRogue48HAUnaryAnswerIsOneWrite(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	_, ctx, admin := serveOn(t, ln, controlplane.Config{})
	url := "http://" + ln.Addr().String()
	op := agentsdk.Dial(url, admin)
	root := register(t, op, "rogue48h")
	agent := agentsdk.Dial(url, root.Credential)
	read := func() {
		t.Helper()
		resp, err := agent.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Node.GetNodeId() != root.Node.NodeId {
			t.Fatalf("GetNode answered %s", resp.Msg.Node.GetNodeId())
		}
	}
	read() // the connection's start: its SETTINGS and their acknowledgements
	const calls = 100
	before := ln.writes.Load()
	for range calls {
		read()
	}
	writes := ln.writes.Load() - before
	// A window update or a PING's acknowledgement may go between calls,
	// and an answer's HEADERS alone when its stream's end is noted before
	// its DATA is written (frameGuard.answerDone): rarely, more often
	// under the race detector.
	if writes > calls+calls/2 {
		t.Fatalf("%d unary answers took %d writes of the server's, want about one each", calls, writes)
	}
	t.Logf("%d unary answers, %d writes", calls, writes)
}
