package controlplane_test

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// consoleSignIn signs in to the console with token and returns the
// session's cookie ("name=value").
func consoleSignIn(t *testing.T, srv *testserver.Server, token string) string {
	t.Helper()
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	signin, err := browser.PostForm(srv.URL+"/ui/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	signin.Body.Close()
	for _, c := range signin.Cookies() {
		if c.Name == "tether_console" {
			return c.Name + "=" + c.Value
		}
	}
	t.Fatalf("the sign-in answered %s with no session cookie", signin.Status)
	return ""
}

// TestRogue29AConsolePageExemptionEndsWithTheOperatorsCredential: a
// connection once bound to an operator wrote every console page past
// controlplane.PreAuthRequests, for as long as it lived, whoever asked and
// whatever became of the operator's credential. An operator whose token
// was revoked (a stolen one, or an insider's), holding a connection one
// call of that token had bound, asked console pages on it — with the
// console session the token had opened, or with none — and granted no
// flow-control window: each page waited for its write deadline, its
// goroutine and request held, 240 on one connection, over the operator's
// share of the connections. A page is now written past the bound only when
// its own session's call to the API was admitted as an operator's, which
// a revoked or expired token's is not: past the bound the others have
// their stream reset, and the connection is kept.
func TestRogue29AConsolePageExemptionEndsWithTheOperatorsCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	const flood = 240
	for _, tc := range []struct {
		name    string
		session bool // the pages carry the revoked token's console session
	}{
		{"with the revoked token's session", true},
		{"without a session", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A server each: the revoked token's refusals spend its
			// address's anonymous budget.
			srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
				cfg.AnonymousRateLimit = 100
				// Unbounded: pages without a session earn no frames
				// since the forty-eighth pass, and with the clock stopped
				// the frame budget (rogue38b, rogue48g) would stop
				// reading the flood before what this test measures.
				cfg.Conn.ControlFrames = -1
			})
			admin := srv.AdminClients()
			addr := hostOf(t, srv.URL)
			tok := createToken(t, admin, tetherv1.Role_ROLE_ADMIN, "mallory", time.Hour)
			cookie := consoleSignIn(t, srv, tok.Token)
			r := newStallRogue(t, addr)
			bindStalled(t, r, tok.Token)
			if _, err := admin.Auth.RevokeToken(context.Background(), connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: tok.TokenId, Reason: "stolen"})); err != nil {
				t.Fatal(err)
			}
			g0, _ := serverLoad()
			fields := [][2]string{{":method", "GET"}, {":path", "/ui/tree"}}
			if tc.session {
				fields = append(fields, [2]string{"cookie", cookie})
			}
			var ids []uint32
			for range flood {
				id, err := openRaw(r, true, fields...)
				if err != nil {
					t.Fatalf("the connection failed after %d pages: %v", len(ids), err)
				}
				ids = append(ids, id)
			}
			ended := func() int {
				n := 0
				for _, id := range ids {
					if r.isEnded(id) {
						n++
					}
				}
				return n
			}
			testserver.WaitFor(t, closeWait, "all but PreAuthRequests of the unread pages to be ended", func() bool {
				return ended() >= flood-controlplane.PreAuthRequests
			})
			g, _ := serverLoad()
			t.Logf("%d pages: %d ended; goroutines %d -> %d", flood, ended(), g0, g)
			if r.isClosed() {
				t.Fatal("the bound connection was closed; only the unread pages were to end")
			}
		})
	}
}

// goawayWatcher is a stallRogue that also notes the GOAWAY the server
// sends and the status each stream is answered with.
type goawayWatcher struct {
	*stallRogue
	answered sync.Map // stream id -> struct{}: ended by the answer's last frame
	mu       sync.Mutex
	goaway   *http2.GoAwayFrame
}

func newGoawayWatcher(t *testing.T, addr string) *goawayWatcher {
	t.Helper()
	w := &goawayWatcher{stallRogue: &stallRogue{}}
	w.h2conn = newH2Conn(t, addr, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(c *h2conn, f http2.Frame) {
		switch f := f.(type) {
		case *http2.PingFrame:
			if !f.IsAck() {
				c.mu.Lock()
				_ = c.fr.WritePing(true, f.Data)
				c.mu.Unlock()
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.mu.Lock()
				_ = c.fr.WriteSettingsAck()
				c.mu.Unlock()
			}
		case *http2.RSTStreamFrame:
			w.resets.Add(1)
			w.ended.Store(f.StreamID, struct{}{})
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				w.ended.Store(f.StreamID, struct{}{})
				w.answered.Store(f.StreamID, struct{}{})
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				w.ended.Store(f.StreamID, struct{}{})
				w.answered.Store(f.StreamID, struct{}{})
			}
		case *http2.GoAwayFrame:
			w.mu.Lock()
			w.goaway = f
			w.mu.Unlock()
		}
	})
	return w
}

// goAway is the GOAWAY the server sent, or nil.
func (w *goawayWatcher) goAway() *http2.GoAwayFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.goaway
}

// TestRogue29AnIdleClosingConnectionLosesNoHonestCall: a bound connection
// that carries no admitted request for the idle timeout (a dead agent's
// refusals, a GET /healthz now and then) was closed at once, without a
// GOAWAY: a call its client sent at that moment — the first admitted call
// after a quiet spell, from a client that polls /healthz on the same
// connection — was cut off unanswered, and an HTTP/2 client cannot tell
// whether the server had begun it, so it fails unavailable rather than
// being retried. The connection is now closed gracefully: once judged, it
// tells the client to go (HTTP/2: GOAWAY) with the answer of each request
// it carries, so a call sent then is answered and the next one goes to a
// new connection; the requests that were not admitted and may wait long
// (here a GET /healthz whose answer the client does not take) have their
// streams reset, and the connection, then carrying nothing, is closed by
// the server's idle close, which sends a GOAWAY too. The call sent once
// the connection is judged is answered with a GOAWAY (NO_ERROR) that
// covers it, or is left out of the GOAWAY (not begun: the client retries
// it); either way the connection closes, and its place is given back.
func TestRogue29AnIdleClosingConnectionLosesNoHonestCall(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run real servers for long; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), stallLimits, func(cfg *controlplane.Config) {
		cfg.Conn.IdleTimeout = closeWait / 20
	})
	admin := srv.AdminClients()
	addr := hostOf(t, srv.URL)
	agent := register(t, admin, "honest")
	before := srv.OpenConnections()
	w := newGoawayWatcher(t, addr)
	bindStalled(t, w.stallRogue, agent.Credential)
	// A request that is never admitted, its answer not taken: it keeps the
	// connection busy, and without admitted work.
	if _, err := openRaw(w.stallRogue, true, [2]string{":method", "GET"}, [2]string{":path", "/healthz"}); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, closeWait, "the connection to be judged without admitted work", func() bool {
		return w.isClosed() || srv.ClosingConnections() == 1
	})
	// The call the client sends at that moment.
	id, err := openRaw(w.stallRogue, true, [2]string{":method", "POST"}, [2]string{":path", tetherv1connect.AuthServiceWhoAmIProcedure},
		[2]string{"content-type", "application/proto"}, [2]string{"authorization", "Bearer " + agent.Credential})
	if err == nil {
		w.mu.Lock()
		err = w.fr.WriteWindowUpdate(id, 1<<20)
		w.mu.Unlock()
	}
	select {
	case <-w.closed:
	case <-time.After(closeWait): // a guard against a hang, not a timing
		t.Fatalf("the connection was kept for %s after it was judged", closeWait)
	}
	g := w.goAway()
	_, answered := w.answered.Load(id)
	switch {
	case answered:
		if g == nil || g.ErrCode != http2.ErrCodeNo {
			t.Fatalf("the call was answered, but the connection closed without a GOAWAY (NO_ERROR): %v", g)
		}
		t.Logf("the call (stream %d) was answered; GOAWAY %v", id, g)
	case g != nil && g.ErrCode == http2.ErrCodeNo && g.LastStreamID < id:
		// Not begun: the client retries it on a new connection.
		t.Logf("the call (stream %d) was left out of the GOAWAY %v: the client retries it", id, g)
	default:
		t.Fatalf("the call sent when the connection was judged (stream %d, write error %v) was lost: the connection closed without answering it, GOAWAY %v", id, err, g)
	}
	testserver.WaitFor(t, closeWait, "the connection's place to be given back", func() bool {
		return srv.OpenConnections() <= before && srv.ClosingConnections() == 0
	})
}

// TestRogue29ALineageMemberHoldingTheShareCannotKeepASiblingOffTheServer:
// a lineage's connections are one share (--max-connections-per-lineage),
// so a rogue member that bound the whole share — each connection kept
// with a quiet stream, which the lineage's stream share allows on every
// connection — had every call of a sibling that held no connection (a
// child just spawned, one whose connection broke) refused
// resource_exhausted and its connection closed: the sibling could not
// open its session to hear its stop, the reserve of signal streams each
// node has beside the share (controlplane.SignalStreamReserve) useless
// without a connection to open them on. A node that bound no connection
// now binds controlplane.ConnectionReserve past its lineage's share; the
// rogue, which bound connections of its own, gets no more.
func TestRogue29ALineageMemberHoldingTheShareCannotKeepASiblingOffTheServer(t *testing.T) {
	const share = 2
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.Conn = controlplane.ConnLimits{MaxConnections: 16, MaxConnectionsPerLineage: share, PreAuthTimeout: time.Hour}
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	sibling := spawn(t, admin, rogue.Node.NodeId, "honest")
	for i := range share {
		if err := whoAmI(newOwnConn(t, srv, rogue.Credential).Clients); err != nil {
			t.Fatalf("the rogue's connection %d: %v", i+1, err)
		}
	}
	err := whoAmI(newOwnConn(t, srv, rogue.Credential).Clients)
	wantLimit(t, "the rogue's connection past the share", err, connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId, "the limit per lineage", "--max-connections-per-lineage")
	// The sibling, holding no connection, gets one and is served on it.
	own := newOwnConn(t, srv, sibling.Credential)
	if err := whoAmI(own.Clients); err != nil {
		t.Fatalf("the sibling's first connection, the rogue holding its lineage's share: %v", err)
	}
	if _, err := own.Agent.Heartbeat(context.Background(), connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: sibling.Node.NodeId})); err != nil {
		t.Fatalf("the sibling's heartbeat on its connection: %v", err)
	}
	// Its reserve is one connection; the rogue's is spent on its share.
	err = whoAmI(newOwnConn(t, srv, sibling.Credential).Clients)
	wantLimit(t, "the sibling's second connection past the share", err, connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId, "--max-connections-per-lineage",
		"agent:"+sibling.Node.NodeId+" already holds 1 connection of its own")
	err = whoAmI(newOwnConn(t, srv, rogue.Credential).Clients)
	wantLimit(t, "the rogue's connection past the share, after the sibling's", err, connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId, "--max-connections-per-lineage")
}
