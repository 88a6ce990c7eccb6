package controlplane_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
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

// TestRogue36BAnAgentCannotHoldManyCallsWaitingForTheirBodies: a rogue
// agent with a valid credential opens unary calls whose bodies it never
// sends (HEADERS without END_STREAM), 200 on each of four connections of
// its own. Each call was admitted from its headers, charged one request,
// and its handler waited for the body until --read-timeout (30 s by
// default): 250 such calls on each of the connections its lineage may
// hold (half of --max-connections), as many as its budget paid for —
// some 320,000 handlers at the default rate, each a goroutine and its
// stream. Now a lineage holds at most --max-streams-per-lineage calls
// whose bodies have not all arrived, and each node controlplane.BodyReserve
// more of its own (a sibling of the rogue, and another lineage, are still
// served); past them a call is refused resource_exhausted from its headers.
// Measured by the goroutines the server's connections hold (wide margin)
// and the rogue's calls answered, never by time.
func TestRogue36BAnAgentCannotHoldManyCallsWaitingForTheirBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the goroutine measurement; make test and CI run them.")
	}
	const share = 16
	rig := newHeldCallsRig(t, share, func(cfg *controlplane.Config) {
		cfg.Conn.ReadTimeout = time.Hour // the bodies are not cut short
		cfg.Conn.ControlFrames = -1      // unbounded: the frame budget (rogue38b) would stop the flood before what this test measures
	})
	srv, root, rogueC, sibling, siblingC, otherC, addr := rig.srv, rig.root, rig.rogueC, rig.sibling, rig.siblingC, rig.otherC, rig.addr
	// The sibling's signal watch, a stream whose request arrived whole,
	// holds no call waiting for its body.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := siblingC.Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	siblingID := "agent:" + sibling.Node.NodeId
	testserver.WaitFor(t, closeWait, "the sibling's watch to open", func() bool { return srv.OpenStreams(siblingID) == 1 })
	if own, _ := srv.AwaitedBodies(siblingID, ""); own != 0 {
		t.Fatalf("the sibling's open watch counts as %d calls waiting for their bodies", own)
	}
	c0 := srv.ConnGoroutines()

	const conns, calls = 4, 200
	rogues := newFloodRogues(t, addr, nil, conns)
	floodEach(t, rogues, func(r *floodRogue) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for range calls {
			if _, err := r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", root.Credential, false); err != nil {
				return err
			}
		}
		return nil
	})
	// Every call past what the lineage may hold is answered (its refusal,
	// or a reset when too many refusals wait on the connection).
	held := share + controlplane.BodyReserve
	answered := func() int64 {
		n := int64(0)
		for _, r := range rogues {
			n += r.ended.Load() + r.rsts.Load()
		}
		return n
	}
	last, since := int64(-1), time.Now()
	for answered() < conns*calls-int64(held) {
		if n := answered(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > closeWait {
			t.Fatalf("%d of the rogue's %d calls without a body answered, %d goroutines held by the server's connections (%d before): the rest wait for their bodies", n, conns*calls, srv.ConnGoroutines(), c0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each connection's own goroutines (its serving loop, its reader),
	// and those held calls: a wide margin, far below conns*calls.
	rogueID := "agent:" + root.Node.NodeId
	own, shared := srv.AwaitedBodies(rogueID, root.Node.NodeId)
	g := srv.ConnGoroutines()
	t.Logf("%d of %d calls answered; %d wait for their bodies (%d of the lineage's share); the server's connections hold %d goroutines (%d before)", answered(), conns*calls, own, shared, g, c0)
	if own != held || shared != share {
		t.Errorf("%d of the rogue's calls wait for their bodies, %d of its lineage's share: want %d and %d", own, shared, held, share)
	}
	if g > c0+held+conns*16+100 {
		t.Errorf("the server's connections hold %d goroutines (%d before) with the rogue's calls waiting for their bodies; at most %d calls may wait", g, c0, held)
	}
	// Its sibling (from its own reserve) and another lineage are served;
	// the rogue's own next call is told why it is refused.
	if err := whoAmI(siblingC); err != nil {
		t.Errorf("the rogue's sibling's call: %v", err)
	}
	if err := whoAmI(otherC); err != nil {
		t.Errorf("another lineage's call: %v", err)
	}
	_, err = rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "bodies") {
		t.Errorf("the rogue's own call with %d calls waiting for their bodies: %v, want resource_exhausted naming the calls waiting for their bodies", held, err)
	}
	// Once its connections close, what they held is given back.
	for _, r := range rogues {
		_ = r.c.Close()
	}
	// (Each held handler gives its slot back as its body's read fails, on
	// its own goroutine: waited for, not raced; closeWait is no time bound.)
	testserver.WaitFor(t, closeWait, "the rogue's calls waiting for their bodies to be given back", func() bool {
		own, shared := srv.AwaitedBodies(rogueID, root.Node.NodeId)
		return own == 0 && shared == 0
	})
	if _, err := rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Errorf("with its connections closed and nothing waiting for a body, the rogue's own call: %v", err)
	}
}

// TestRogue36BRapidResetsBeforeAuthenticationHoldNothing: a client
// without a credential opens calls and resets each at once (HEADERS then
// RST_STREAM, CVE-2023-44487), 5,000 on each of four connections, some
// with a token that does not verify. Go's server starts a handler per
// stream it has not yet refused, at most --max-streams-per-conn at once;
// each is refused from its headers, its address's budget paying before
// any verification, and a connection past controlplane.PreAuthRequests
// requests in flight is closed (seen: three or four of the four, 29–54
// goroutines at the peak). Measured, not timed: the goroutines the connections hold at the
// flood's peak stay within the streams' bound, every one is given back
// when they close, the heap after a GC grows by less than a wide margin,
// and an operator's call on a connection of its own is served throughout.
// (It held; the per-frame CPU remains, docs/design.md §11.)
func TestRogue36BRapidResetsBeforeAuthenticationHoldNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the goroutine measurement; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1          // bursts of 2, never refilled
		cfg.Conn.PreAuthTimeout = time.Hour // the flood is not cut short
		cfg.Conn.ControlFrames = -1         // unbounded: the frame budget (rogue38b) would stop the flood before what this test measures
	})
	op := newOwnConn(t, srv, srv.Admin)
	if err := whoAmI(op.Clients); err != nil {
		t.Fatal(err)
	}
	addr := hostOf(t, srv.URL)
	c0 := srv.ConnGoroutines()
	_, h0 := serverLoad()
	const conns, resets = 4, 5000
	rogues := newFloodRogues(t, addr, nil, conns)
	var peak atomic.Int64
	floodEach(t, rogues, func(r *floodRogue) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i := range resets {
			cred := ""
			if i%2 == 0 {
				cred = "eyJhbGciOiJFZERTQSJ9.e30.c2ln" // does not verify
			}
			id, err := r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", cred, false)
			if err == nil {
				err = r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
			if err != nil {
				return nil // the server closed the connection: its right
			}
			if i%500 == 0 {
				g := int64(srv.ConnGoroutines())
				for p := peak.Load(); g > p && !peak.CompareAndSwap(p, g); p = peak.Load() {
				}
			}
		}
		return nil
	})
	if err := whoAmI(op.Clients); err != nil {
		t.Errorf("an operator's call during the flood: %v", err)
	}
	perConn := controlplane.DefaultConnLimits.MaxStreamsPerConn
	_, h := serverLoad()
	closed := 0
	for _, r := range rogues {
		if r.isClosed() {
			closed++
		}
	}
	t.Logf("peak %d goroutines on the server's connections (%d before); heap %d KiB after GC (%d before); %d of %d connections closed by the server", peak.Load(), c0, h>>10, h0>>10, closed, conns)
	if p := int(peak.Load()); p > c0+conns*(perConn+8) {
		t.Errorf("%d goroutines on the server's connections at the flood's peak, %d before: more than %d connections' streams account for", p, c0, conns)
	}
	if h > h0+64<<20 {
		t.Errorf("heap %d KiB after GC with the flood's connections open, %d KiB before", h>>10, h0>>10)
	}
	for _, r := range rogues {
		_ = r.c.Close()
	}
	testserver.WaitFor(t, closeWait, "the flood's goroutines to be given back", func() bool { return srv.ConnGoroutines() <= c0+2 })
	if err := whoAmI(op.Clients); err != nil {
		t.Errorf("an operator's call after the flood: %v", err)
	}
}

// TestRogue36BAHeaderBlockThatNeverEndsIsClosedWithoutPings: a header
// block trickled in CONTINUATION frames, a field every 10 ms, is no
// stream until it ends, so no request timeout reaches it; the rogue6 test
// saw it closed by the ping timeouts. With pings an hour apart it is
// closed all the same: before a credential by --preauth-timeout (the
// connection carries no request in flight), and on a connection an
// authenticated call of the rogue's bound, by --idle-timeout. The
// guard never cuts inside a block, and the block's fields past
// --max-header-bytes are not kept. (It held.)
func TestRogue36BAHeaderBlockThatNeverEndsIsClosedWithoutPings(t *testing.T) {
	for _, authenticated := range []bool{false, true} {
		name := "before a credential"
		if authenticated {
			name = "after a call admitted"
		}
		t.Run(name, func(t *testing.T) {
			srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
				cfg.Conn.PingInterval, cfg.Conn.PreAuthTimeout, cfg.Conn.IdleTimeout = time.Hour, time.Hour, time.Hour
				if authenticated {
					cfg.Conn.IdleTimeout = 300 * time.Millisecond
				} else {
					cfg.Conn.PreAuthTimeout = 300 * time.Millisecond
				}
			})
			admin := srv.AdminClients()
			root := register(t, admin, "rogue")
			r := newFloodRogue(t, hostOf(t, srv.URL), nil)
			r.mu.Lock()
			defer r.mu.Unlock()
			if authenticated {
				if _, err := r.writeHeaders(tetherv1connect.AuthServiceWhoAmIProcedure, "application/json", root.Credential, false); err != nil {
					t.Fatal(err)
				}
				if err := r.fr.WriteData(1, true, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				testserver.WaitFor(t, closeWait, "the admitted call's answer", func() bool { return r.ended.Load() >= 1 })
			}
			r.hbuf.Reset()
			for _, kv := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "tether"}, {":path", "/healthz"}} {
				_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.next, BlockFragment: r.hbuf.Bytes(), EndStream: true}); err != nil {
				t.Fatal(err)
			}
			r.hbuf.Reset()
			_ = r.enc.WriteField(hpack.HeaderField{Name: "x-a", Value: "a"})
			field := bytes.Clone(r.hbuf.Bytes())
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			guard := time.After(closeWait) // a guard against a hang, not a timing
			for sent := 0; ; sent++ {
				select {
				case <-r.closed:
					t.Logf("closed after %d CONTINUATION frames", sent)
					return
				case <-guard:
					t.Fatalf("the server kept a header block open for %s without pinging (%d CONTINUATION frames)", closeWait, sent)
				case <-tick.C:
					_ = r.fr.WriteContinuation(r.next, false, field)
				}
			}
		})
	}
}

// heldCallsRig is the world of a rogue agent holding calls on its own
// connections (rogue36b's bodies never sent, rogue37b's answers never
// read): a server whose lineages share share streams of each kind, on a
// manual clock, the rate budget unrefilled and plenty; the rogue (a root),
// its sibling (a child of the rogue's), another lineage's root, their
// clients, and the server's address.
type heldCallsRig struct {
	srv                      *testserver.Server
	root                     *tetherv1.RegisterRootResponse
	sibling                  *tetherv1.SpawnResponse
	rogueC, siblingC, otherC *testserver.Clients
	addr                     string
}

// newHeldCallsRig starts a heldCallsRig; configure sets the timeout the
// test holds its calls against.
func newHeldCallsRig(t *testing.T, share int, configure func(cfg *controlplane.Config)) heldCallsRig {
	t.Helper()
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.RateLimit, cfg.RateBurst = 1, 100000 // no refill, and plenty
		cfg.Conn.MaxStreamsPerLineage = share
		configure(cfg)
	})
	admin := srv.AdminClients()
	r := heldCallsRig{srv: srv, root: register(t, admin, "rogue"), addr: hostOf(t, srv.URL)}
	r.rogueC = srv.Clients(r.root.Credential)
	r.sibling = spawn(t, r.rogueC, r.root.Node.NodeId, "sibling")
	r.siblingC = srv.Clients(r.sibling.Credential)
	r.otherC = srv.Clients(register(t, admin, "other").Credential)
	return r
}
