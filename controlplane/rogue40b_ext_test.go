package controlplane_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// TestRogue40BDataFramesOnEndedStreamsAreChargedAsFrames: a rogue agent
// binds a connection of its own with a call (stream 1, answered and
// ended), then sends 5,000 DATA frames of one byte each on that ended
// stream. A DATA frame carrying a payload cost the connection's frame
// budget nothing (its bytes were taken for a request's body, charged by
// their size), but on a stream already ended they are nobody's body: Go's
// HTTP/2 server answers each with a RST_STREAM, a frame's work each,
// charged to no budget, for as long as the connection lives — the
// thirty-eighth pass's bound on frames that carry no request's work
// (ConnLimits.ControlFrames) sidestepped by a byte. Now only a DATA frame
// on a stream the peer opened and neither side has ended is free: with
// the clock stopped the rogue's connection is read no further once it has
// spent its budget, at most the budget's frames answered, while another
// agent's calls are served.
func TestRogue40BDataFramesOnEndedStreamsAreChargedAsFrames(t *testing.T) {
	const flood = 5000
	limits := controlplane.DefaultConnLimits
	// What the rogue's connection may read with the clock stopped: the
	// budget, what its binding call earned, the server's SETTINGS and
	// PINGs, and the frame that spent it.
	bound := int64(limits.ControlFrames + controlplane.FramesPerRequest + 8)
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	otherC := srv.Clients(register(t, admin, "other").Credential)
	before := srv.ThrottledConnections()
	r := newFloodRogue(t, hostOf(t, srv.URL), nil)
	bindRogue(t, r, rogue.Credential)
	var sendErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for range flood {
			if sendErr = r.fr.WriteData(1, false, []byte{'x'}); sendErr != nil {
				return
			}
		}
	})
	// Either every DATA frame is answered (the hole), or the connection
	// is throttled first.
	testserver.WaitFor(t, closeWait, "the rogue's DATA frames answered or its connection throttled", func() bool {
		return r.rsts.Load() >= flood || srv.ThrottledConnections() > before
	})
	if n := r.rsts.Load(); n > bound {
		t.Fatalf("%d of the rogue's %d one-byte DATA frames on an ended stream answered with a RST_STREAM with the clock stopped, want at most %d", n, flood, bound)
	}
	if n := srv.ThrottledConnections(); n != before+1 {
		t.Fatalf("%d connections throttled, want %d (the rogue's alone)", n, before+1)
	}
	for range 20 {
		if err := whoAmI(otherC); err != nil {
			t.Fatalf("another agent's call while the rogue is throttled: %v", err)
		}
	}
	_ = r.c.Close()
	clk.Advance(controlplane.MaxThrottled + time.Second)
	testserver.WaitFor(t, closeWait, "the closed connection to leave the throttled count", func() bool {
		return srv.ThrottledConnections() == before
	})
	wg.Wait()
	_ = sendErr // the flood fails once the connection is closed
}
