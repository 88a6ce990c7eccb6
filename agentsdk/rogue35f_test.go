package agentsdk_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// rogue35fFeed is a verifier on a manual clock following srv's revocation
// feed through a client that dials whichever address addr holds, and
// counts the dials made to dead.
type rogue35fFeed struct {
	v     *agentsdk.Verifier
	clk   *clock.Manual
	addr  atomic.Pointer[string]
	dead  string
	dials atomic.Int32 // to dead
}

func rogue35fStartFeed(t *testing.T, srv *testserver.Server) *rogue35fFeed {
	t.Helper()
	f := &rogue35fFeed{clk: clock.NewManual(time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)), dead: "127.0.0.1:1"}
	host := srv.URL[len("http://"):]
	f.addr.Store(&host)
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: p, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		to := *f.addr.Load()
		if to == f.dead {
			f.dials.Add(1)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, to)
	}}}
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{
		Conn:            agentsdk.Dial("http://tether.test", srv.Admin, agentsdk.WithHTTPClient(client)),
		Clock:           f.clk,
		StalenessBudget: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.v = v
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-v.Ready()
	return f
}

// kill ends the feed for good: the verifier hears nothing more once it
// has tried another connection (its stream is over by then).
func (f *rogue35fFeed) kill(t *testing.T, srv *testserver.Server) {
	t.Helper()
	f.addr.Store(&f.dead)
	srv.Stop()
	testserver.WaitFor(t, time.Minute, "the verifier's feed ended and redialled", func() bool { return f.dials.Load() > 0 })
}

// TestRogue35FAClockSetBackDoesNotShortenTheFeedsAge: the feed that a
// tool server's verifier follows dies (the rogue cut it, or the control
// plane is gone), and then the verifier's injected clock is set back
// five seconds (an NTP step, a VM resumed) while the rogue keeps calling.
// The verifier measured the feed's age as the clock's now minus the
// message's arrival, so the step took five seconds off it: a feed dead
// for 13 s of the clock's own ticking read 8 s old, and the rogue's token
// (revoked meanwhile, unheard) was still checked against the old set.
// The age now adds up the clock's forward steps only.
func TestRogue35FAClockSetBackDoesNotShortenTheFeedsAge(t *testing.T) {
	srv := testserver.Start(t)
	f := rogue35fStartFeed(t, srv)
	f.kill(t, srv)

	f.clk.Advance(8 * time.Second)
	if err := f.v.Fresh(); err != nil {
		t.Fatalf("8 s after the last message, within the budget of 10: %v", err)
	}
	f.clk.Advance(-5 * time.Second) // the clock set back
	if err := f.v.Fresh(); err != nil {
		t.Fatalf("after the step back, 8 s of the clock's ticking since the last message: %v", err)
	}
	f.clk.Advance(5 * time.Second)
	if err := f.v.Fresh(); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("13 s of the clock's ticking since the feed died (5 s of it before a step back): %v, want the feed stale", err)
	}
}

// TestRogue35FAClockSetBackPastTheLastMessageFailsClosed: the feed dies
// and the clock is set back an hour, past the feed's last message, then
// the budget passes without the verifier looking in between. The age read
// an hour less than nothing, and the dead feed was fresh for the hour. A
// clock behind the feed's last message cannot tell the feed's age: every
// check fails closed until the clock passes it again or the feed speaks.
func TestRogue35FAClockSetBackPastTheLastMessageFailsClosed(t *testing.T) {
	srv := testserver.Start(t)
	f := rogue35fStartFeed(t, srv)
	f.kill(t, srv)

	f.clk.Advance(-time.Hour)
	f.clk.Advance(10*time.Second + time.Millisecond)
	if err := f.v.Fresh(); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("a dead feed, the clock set back an hour and the budget passed: %v, want the feed stale", err)
	}
}

// TestRogue35FALiveFeedIsFreshAgainAfterAStepBack: the clock set back an
// hour under a live feed makes the verifier fail closed only until the
// feed's next message (its heartbeat), from which the age counts again.
func TestRogue35FALiveFeedIsFreshAgainAfterAStepBack(t *testing.T) {
	srv := testserver.Start(t)
	f := rogue35fStartFeed(t, srv)
	f.clk.Advance(-time.Hour)
	testserver.WaitFor(t, time.Minute, "the verifier fresh at the feed's next message", func() bool { return f.v.Fresh() == nil })
}
