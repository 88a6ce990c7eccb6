//go:build unix

package controlplane_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestARogueReadingNothingLosesItsConnection: an authenticated rogue asks
// for answers on a connection it then never reads again (a small receive
// buffer of its own, so the server's writes stop at once), and keeps the
// connection's read side busy with a PRIORITY frame every few
// milliseconds — no frame the server answers, so no control frame piles
// up, and never silent, so the server never pings it. The server's
// writer waited in the socket's write for as long as the rogue liked: the
// idle timeout's GOAWAY could not be written, so the connection was never
// closed — its goroutines, its buffers and the kernel's held, and a
// place in its lineage's share kept without a call. A connection none of
// whose bytes the peer takes for the write timeout is now closed.
func TestARogueReadingNothingLosesItsConnection(t *testing.T) {
	// An idle connection is closed a second after its last stream ends
	// (GOAWAY, then closed): this one would be too, could it be written to.
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), stallLimits, func(cfg *controlplane.Config) { cfg.Conn.IdleTimeout = time.Second })
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	addr := hostOf(t, srv.URL)

	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, nil)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	next := uint32(1)
	request := func(method, path string, header ...string) {
		t.Helper()
		hbuf.Reset()
		fields := append([]string{":method", method, ":scheme", "http", ":authority", "tether", ":path", path}, header...)
		for i := 0; i < len(fields); i += 2 {
			_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: next, BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
		next += 2
	}
	// An authenticated call binds the connection to the rogue's lineage
	// (else the pre-authentication window would close it); then answers
	// of some size, none of which it reads.
	request("POST", tetherv1connect.AuthServiceWhoAmIProcedure, "content-type", "application/json", "authorization", "Bearer "+root.Credential)
	for range 240 {
		request("GET", "/metrics")
	}

	// The server closing the connection shows as the rogue's write failing
	// (its frames then reach a closed socket, which resets).
	ctx, cancel := context.WithTimeout(context.Background(), 3*closeWait) // a guard against a hang, not a timing
	defer cancel()
	for ctx.Err() == nil {
		if err := fr.WritePriority(1, http2.PriorityParam{Weight: 1}); err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the rogue's pace: well inside the ping interval, never silent
	}
	if ctx.Err() != nil {
		t.Fatalf("the server kept for %s a connection whose peer read none of its answers", 3*closeWait)
	}
	if err := whoAmI(srv.Clients(root.Credential)); err != nil {
		t.Fatalf("the rogue's next connection: %v", err)
	}
}
