package controlplane_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// rogueConn is a floodRogue holding an agent's credential.
type rogueConn struct {
	*floodRogue
	cred string
}

// bindRogue has r make one authenticated call (WhoAmI with cred) on its
// connection, binding it to the caller, and waits for its answer.
func bindRogue(t *testing.T, r *floodRogue, cred string) {
	t.Helper()
	r.mu.Lock()
	_, err := r.writeHeaders(tetherv1connect.AuthServiceWhoAmIProcedure, "application/proto", cred, true)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "the rogue's authenticated call to be answered", func() bool { return r.ended.Load() >= 1 })
}

// TestRogue38BControlFramesAfterAuthenticationAreThrottledOnTheirConnection:
// an authenticated rogue agent binds a connection of its own with a call,
// then sends frames that carry no request's work, 5,000 back to back:
// PINGs, SETTINGS, WINDOW_UPDATEs, PRIORITY frames, empty DATA frames on
// a stream it holds open, empty CONTINUATIONs of a header block, HEADERS
// the server refuses before any handler (no :path), and GET /healthz
// requests (a handler each, charged to nobody). Go's HTTP/2 server
// answered every one for as long as the connection lived, a frame's CPU
// each, charged to no budget (docs/design.md §11 until the thirty-eighth
// pass). Now each connection's frames are charged to a frame budget of
// its own (controlplane.ConnLimits.ControlFrames), earned by the requests
// on it the auth Gate judges and by time: with the clock stopped, the rogue's
// connection is read no further once it spent it — a PING flood has at
// most the budget's PINGs answered — while another agent's calls, over
// the test's own connection shared by every honest caller, are served
// and never throttled. Time refills the rogue's budget, and its
// connection is read again (slowed, not closed).
func TestRogue38BControlFramesAfterAuthenticationAreThrottledOnTheirConnection(t *testing.T) {
	const flood = 5000
	limits := controlplane.DefaultConnLimits
	// What the rogue's connection may read with the clock stopped: the
	// budget, what its binding call earned, the server's SETTINGS and
	// PINGs, and the frame that spent it.
	bound := int64(limits.ControlFrames + controlplane.FramesPerRequest + 8)
	headerBlock := func(r *rogueConn, path string) []byte {
		r.hbuf.Reset()
		for _, kv := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "tether"}, {":path", path}} {
			_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		return r.hbuf.Bytes()
	}
	for _, tc := range []struct {
		name  string
		setup func(r *rogueConn) error
		send  func(r *rogueConn, i int) error
	}{
		{"PING", nil, func(r *rogueConn, i int) error { return r.fr.WritePing(false, [8]byte{byte(i >> 8), byte(i)}) }},
		{"SETTINGS", nil, func(r *rogueConn, _ int) error { return r.fr.WriteSettings() }},
		{"WINDOW_UPDATE", nil, func(r *rogueConn, _ int) error { return r.fr.WriteWindowUpdate(0, 1) }},
		{"PRIORITY", nil, func(r *rogueConn, i int) error {
			return r.fr.WritePriority(uint32(2*i+101), http2.PriorityParam{StreamDep: uint32(2*i + 103), Weight: 9})
		}},
		{"empty DATA", func(r *rogueConn) error {
			_, err := r.writeHeaders(tetherv1connect.AuthServiceWhoAmIProcedure, "application/proto", r.cred, false)
			return err
		}, func(r *rogueConn, _ int) error { return r.fr.WriteData(3, false, nil) }},
		{"empty CONTINUATION", func(r *rogueConn) error {
			return r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: headerBlock(r, "/healthz"), EndStream: true})
		}, func(r *rogueConn, _ int) error { return r.fr.WriteContinuation(3, false, nil) }},
		{"HEADERS without a :path", nil, func(r *rogueConn, i int) error {
			return r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 3), BlockFragment: []byte{0x82, 0x86}, EndStream: true, EndHeaders: true})
		}},
		{"GET /healthz", nil, func(r *rogueConn, i int) error {
			return r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 3), BlockFragment: headerBlock(r, "/healthz"), EndStream: true, EndHeaders: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(epoch)
			srv := testserver.Start(t, testserver.WithClock(clk))
			admin := srv.AdminClients()
			rogue := register(t, admin, "rogue")
			otherC := srv.Clients(register(t, admin, "other").Credential)
			before := srv.ThrottledConnections()
			r := &rogueConn{floodRogue: newFloodRogue(t, hostOf(t, srv.URL), nil), cred: rogue.Credential}
			bindRogue(t, r.floodRogue, rogue.Credential)
			var sendErr error
			var wg sync.WaitGroup
			// The flood is written on its own goroutine: a connection the
			// server reads no further takes only what the kernel buffers.
			wg.Go(func() {
				r.mu.Lock()
				defer r.mu.Unlock()
				if tc.setup != nil {
					if sendErr = tc.setup(r); sendErr != nil {
						return
					}
				}
				for i := range flood {
					if sendErr = tc.send(r, i); sendErr != nil {
						return
					}
				}
			})
			testserver.WaitFor(t, closeWait, "the rogue's connection to be throttled", func() bool {
				return srv.ThrottledConnections() > before
			})
			// Another agent's calls, over the connection every honest
			// caller of the test shares, go on; that one is not throttled.
			for range 20 {
				if err := whoAmI(otherC); err != nil {
					t.Fatalf("another agent's call while the rogue is throttled: %v", err)
				}
			}
			if n := srv.ThrottledConnections(); n != before+1 {
				t.Fatalf("%d connections throttled, want %d (the rogue's alone)", n, before+1)
			}
			if tc.name == "PING" {
				if n := r.acks.Load(); n > bound {
					t.Fatalf("%d of the rogue's %d PINGs answered with the clock stopped, want at most %d", n, flood, bound)
				}
				// Time refills the budget: the connection is read again.
				answered := r.acks.Load()
				clk.Advance(10 * time.Second)
				testserver.WaitFor(t, closeWait, "more of the rogue's PINGs answered once time refilled its budget", func() bool {
					return r.acks.Load() > answered
				})
				if r.isClosed() {
					t.Fatal("the server closed the throttled connection; want it slowed")
				}
				// Still flooding MaxThrottled after it was first slowed:
				// closed.
				clk.Advance(controlplane.MaxThrottled)
				testserver.WaitFor(t, closeWait, "the server to close the connection still flooding", r.isClosed)
			} else {
				// A rogue gone leaves its frames unread in the server's
				// receive buffer: the connection is closed too, once
				// MaxThrottled has passed, not when its backlog is read.
				_ = r.c.Close()
				clk.Advance(controlplane.MaxThrottled + time.Second)
			}
			testserver.WaitFor(t, closeWait, "the closed connection to leave the throttled count", func() bool {
				return srv.ThrottledConnections() == before
			})
			_ = r.c.Close()
			wg.Wait()
			_ = sendErr // the flood fails once the connection is closed
			if err := whoAmI(otherC); err != nil {
				t.Fatalf("another agent's call after the rogue's connection closed: %v", err)
			}
		})
	}
}

// TestRogue38BAnHonestSharedConnectionIsNeverThrottled: the connection a
// follower forwards its callers' job-lease calls on, or a process hosting
// several agents, carries many callers' calls — each authenticated as its
// own caller — with the window updates, resets of cancelled calls and
// acknowledgements that come with them. With the clock stopped (no frame
// budget earned by time), 300 calls of three callers over one connection,
// a third of them cancelled in flight, are served and the connection is
// never throttled: what it sends is earned by the calls it carries — and
// so are 400 calls refused on it, as a follower forwards those of a
// caller whose credential is dead or whose budget is spent.
func TestRogue38BAnHonestSharedConnectionIsNeverThrottled(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.RateLimit = 0 })
	admin := srv.AdminClients()
	var callers []*testserver.Clients
	for _, name := range []string{"a", "b"} {
		callers = append(callers, srv.Clients(register(t, admin, name).Credential))
	}
	callers = append(callers, admin)
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := range 300 {
		c := callers[i%len(callers)]
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%3 == 0 {
				cancel() // its stream reset in flight, or never sent
			}
			_, err := c.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
			if err != nil && !errors.Is(err, context.Canceled) && connect.CodeOf(err) != connect.CodeCanceled {
				errs <- err
			}
		})
	}
	// A caller whose calls are all refused (its credential does not
	// verify), as a follower forwards those of a caller whose
	// credential is dead or budget spent: each is judged, and earns the
	// connection its frames as an admitted one does.
	for range 400 {
		_ = whoAmI(srv.Clients("not-a-credential"))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("an honest call over the shared connection: %v", err)
	}
	if n := srv.ThrottledConnections(); n != 0 {
		t.Fatalf("%d connections throttled, want none", n)
	}
	if err := whoAmI(admin); err != nil {
		t.Fatal(err)
	}
}
