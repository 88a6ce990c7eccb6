package agentsdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
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
	keys  *rogue35fKeys
	mu    sync.Mutex
	conns []net.Conn // to the control plane
}

// rogue35fKeys is the verifier's road to the control plane, where the
// key set's fetches can be refused or held: its first fetch is refused
// when refuseFirst is set (the verifier starts knowing no key), and a
// fetch made while hold is set reads the control plane's answer whole at
// once, then waits for release before the verifier is given it (a slow
// answer).
type rogue35fKeys struct {
	base        http.RoundTripper
	refuseFirst bool
	fetches     atomic.Int32
	hold        atomic.Bool
	held        chan struct{} // a fetch is held
	release     chan struct{}
}

func (k *rogue35fKeys) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path != agentsdk.JWKSPath {
		return k.base.RoundTrip(req)
	}
	if k.fetches.Add(1) == 1 && k.refuseFirst {
		return nil, errors.New("the key set is not reachable yet")
	}
	resp, err := k.base.RoundTrip(req)
	if err != nil || !k.hold.Load() {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	k.held <- struct{}{}
	<-k.release
	return resp, nil
}

func rogue35fStartFeed(t *testing.T, srv *testserver.Server) *rogue35fFeed {
	return rogue35fStartFeedWith(t, srv, false)
}

func rogue35fStartFeedWith(t *testing.T, srv *testserver.Server, refuseFirstKeys bool) *rogue35fFeed {
	t.Helper()
	f := &rogue35fFeed{clk: clock.NewManual(time.Now()), dead: "127.0.0.1:1"}
	host := srv.URL[len("http://"):]
	f.addr.Store(&host)
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	f.keys = &rogue35fKeys{refuseFirst: refuseFirstKeys, held: make(chan struct{}), release: make(chan struct{}), base: &http.Transport{Protocols: p, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		to := *f.addr.Load()
		if to == f.dead {
			f.dials.Add(1)
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, to)
		if err == nil {
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
		}
		return c, err
	}}}
	client := &http.Client{Transport: f.keys}
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

// kill ends the feed for good, the control plane left running: the
// verifier's connections are cut and it can make no other. It hears
// nothing more once it has tried another connection (its stream is over
// by then).
func (f *rogue35fFeed) kill(t *testing.T) {
	t.Helper()
	f.addr.Store(&f.dead)
	f.mu.Lock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
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
	f.kill(t)

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
	f.kill(t)

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

// TestRogue35FBSlowKeySetAnswerDoesNotOutlastTheFeed: a key the
// verifier does not know yet signs the rogue's token (a rotation; here
// the verifier's first fetch of the key set failed), so its check
// fetches the key set, and the answer is slow (up to the fetch's 10 s).
// Meanwhile the rogue's grant is revoked and the feed dies, unheard, and
// the budget passes. The check had looked at the feed's freshness before
// the fetch only, and accepted the revoked token against a set older
// than the budget once the key set came. Freshness is now looked at
// again where the tombstones are, after the token's signature is known.
func TestRogue35FBSlowKeySetAnswerDoesNotOutlastTheFeed(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	rogue := rogue34fRegister(t, srv.AdminClients(), "rogue")
	x, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: rogue.Node.NodeId, Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := rogue35fStartFeedWith(t, srv, true)
	f.keys.hold.Store(true)
	checked := make(chan error, 1)
	go func() {
		_, err := f.v.Verify(ctx, x.Token)
		checked <- err
	}()
	<-f.keys.held // the check waits for the key set's answer
	f.kill(t)
	if _, err := srv.Grants().Revoke(ctx, rogue34fOperator, grantstore.Target{GrantID: x.Grant.GrantID}, "rogue"); err != nil {
		t.Fatal(err)
	} // unheard
	f.clk.Advance(10*time.Second + time.Millisecond)
	close(f.keys.release)
	if err := <-checked; !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("the rogue's revoked token, checked across a slow key-set answer while the feed died and the budget passed: %v, want the feed stale", err)
	}
}

// TestRogue35FCPrintedObjectsCarryNoSecret: what a framework logs of the
// SDK's objects (a Conn, a spawned Child, a Grant, a CapabilityToken),
// with fmt or slog, is read by whoever reads the logs, a rogue among
// them. fmt printed a *Conn whole, its bearer token included, a Child
// with the credential its process joins with, and %#v or a JSON log line
// a Grant's token; a *CapabilityToken printed the token it keeps. They
// now describe themselves without the secret.
func TestRogue35FCPrintedObjectsCarryNoSecret(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	a, err := agentsdk.RegisterRoot(ctx, srv.Clients(srv.Admin), "parent", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := a.Spawn(ctx, "child", nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := srv.Grants().IssueRoot(ctx, rogue34fOperator, grantstore.RootRequest{HolderNodeID: a.NodeID(), Scopes: []string{"tool:*"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	grant, err := a.RefreshToken(ctx, root.Grant.GrantID)
	if err != nil {
		t.Fatal(err)
	}
	source := a.CapabilityToken(grant)
	secrets := map[string]string{"the agent's credential": a.Credential(), "the child's credential": child.Credential, "the grant's token": grant.Token}
	for what, s := range map[string]any{"conn": a.Conn(), "child": child, "grant": grant, "capability token": source} {
		var text, js bytes.Buffer
		slog.New(slog.NewTextHandler(&text, nil)).Info("x", "v", s)
		slog.New(slog.NewJSONHandler(&js, nil)).Info("x", "v", s)
		printed := map[string]string{
			"%v": fmt.Sprintf("%v", s), "%+v": fmt.Sprintf("%+v", s), "%#v": fmt.Sprintf("%#v", s), "%s": fmt.Sprintf("%s", s),
			"slog text": text.String(), "slog json": js.String(),
		}
		for how, out := range printed {
			for name, secret := range secrets {
				if strings.Contains(out, secret) || strings.Contains(out, secret[strings.LastIndex(secret, ".")+1:]) {
					t.Errorf("the %s printed with %s carries %s: %.200s", what, how, name, out)
				}
			}
		}
	}
}
