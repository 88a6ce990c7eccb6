package controlplane_test

import (
	"bytes"
	"context"
	"math"
	"runtime"
	"strings"
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

// TestRogue32EARogueSharingTheAddressCannotKeepAConnectedAgentsRefreshedCredentialUnverified:
// a rogue behind the same address as an honest agent (a NAT, a shared
// host) sends tokens with forged signatures until the address's budget
// for requests without a valid credential is spent, and keeps it spent.
// The honest agent, connected and working, refreshes its credential (a
// heartbeat's, in the last third of its life): its first call with it
// had to be verified, paid from the address's budget, and was refused
// resource_exhausted for as long as the rogue kept sending. A request on
// a connection bound to a live caller now pays for a verification from
// that caller's own budget, which the rogue, on its own connection,
// cannot spend.
func TestRogue32EARogueSharingTheAddressCannotKeepAConnectedAgentsRefreshedCredentialUnverified(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1 // bursts of 2
	})
	ctx := context.Background()
	honest := register(t, srv.AdminClients(), "honest")
	id := honest.Node.NodeId
	// The honest agent's own connection, bound by its first call.
	hc := testserver.H2CClient()
	if _, err := testserver.NewClients(hc, srv.URL, honest.Credential).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id})); err != nil {
		t.Fatal(err)
	}
	// Its credential in the last third of its life: a heartbeat refreshes it.
	clk.Advance(11 * time.Minute)
	hb, err := testserver.NewClients(hc, srv.URL, honest.Credential).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	fresh := hb.Msg.GetCredential().GetCredential()
	if fresh == "" || fresh == honest.Credential {
		t.Fatalf("the heartbeat refreshed no credential: %v", hb.Msg)
	}

	// The rogue, on its own connection from the same address, spends the
	// address's budget.
	rogueHC := testserver.H2CClient()
	spent := false
	for k := range 16 {
		_, err := testserver.NewClients(rogueHC, srv.URL, forged(honest.Credential, k)).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			spent = true
			break
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("forged token %d: %v, want unauthenticated or resource_exhausted", k, err)
		}
	}
	if !spent {
		t.Fatal("16 forged tokens never spent the address's budget")
	}

	// The honest agent's refreshed credential, on its connection.
	if _, err := testserver.NewClients(hc, srv.URL, fresh).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id})); err != nil {
		t.Errorf("the connected agent's refreshed credential, with the address's budget spent by a rogue: %v (%s), want it verified", err, connect.CodeOf(err))
	}

	// The rogue's own connection still pays the address's budget, spent.
	_, err = testserver.NewClients(rogueHC, srv.URL, forged(honest.Credential, 20)).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: id}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "from 127.0.0.1") {
		t.Errorf("a forged token on the rogue's connection: %v, want resource_exhausted for the address's budget", err)
	}
}

// TestRogue32EARefusalWaitingToBeWrittenDoesNotKeepItsHeaders: a client
// without a credential opens connections granting the server no
// flow-control window and sends on each the eight calls a connection may
// have in flight before it authenticates (controlplane.PreAuthRequests),
// each with 60 KB of headers (within --max-header-bytes, in CONTINUATION
// frames). Each refusal waits to be written until its write deadline, and
// kept its request's headers meanwhile: 480 KB a connection, over every
// connection the server takes without a credential. A refusal now drops
// the headers it does not need to be written before it is.
func TestRogue32EARefusalWaitingToBeWrittenDoesNotKeepItsHeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the heap measurement; make test and CI run them.")
	}
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) {
		cfg.AnonymousRateLimit = 1000 // every refusal is the credential's, not the budget's
	})
	const conns, pad = 12, 60 << 10
	heap := func() int64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	filler := strings.Repeat("x", pad)
	var rogues []*stallRogue
	// flood opens conns connections with perConn refused calls each, and
	// returns the heap they hold once every refusal waits to be written.
	flood := func(perConn int) int64 {
		before := heap()
		base := srv.ConnGoroutines()
		for range conns {
			r := newStallRogue(t, hostOf(t, srv.URL))
			rogues = append(rogues, r)
			r.mu.Lock()
			for range perConn {
				r.hbuf.Reset()
				for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "tether"},
					{":path", tetherv1connect.AgentServiceGetNodeProcedure}, {"content-type", "application/json"},
					{"authorization", "Bearer not-a-credential"}, {"x-pad", filler}} {
					_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1], Sensitive: kv[0] == "x-pad"})
				}
				// In frames of at most 16 KiB: a HEADERS, then CONTINUATIONs.
				block := bytes.Clone(r.hbuf.Bytes())
				const frame = 16 << 10
				first := block[:min(frame, len(block))]
				rest := block[len(first):]
				if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.next, BlockFragment: first, EndHeaders: len(rest) == 0, EndStream: true}); err != nil {
					t.Fatal(err)
				}
				for len(rest) > 0 {
					chunk := rest[:min(frame, len(rest))]
					rest = rest[len(chunk):]
					if err := r.fr.WriteContinuation(r.next, len(rest) == 0, chunk); err != nil {
						t.Fatal(err)
					}
				}
				r.next += 2
			}
			r.mu.Unlock()
		}
		// Every refusal is waiting to be written: its handler's goroutine is held.
		testserver.WaitFor(t, closeWait, "the refusals to wait for their writes", func() bool {
			return srv.ConnGoroutines() >= base+conns*perConn
		})
		return heap() - before
	}
	// A connection's own buffers (its header decoder's) are the same
	// whatever it carries: the difference between connections carrying one
	// refusal and eight is what seven refusals hold. Anything else the
	// process allocates meanwhile (an earlier test's server winding down)
	// only adds to a measure, so the least of up to three is the one
	// judged (the connections of each stay open, so that the next one's
	// waiting refusals are its own): a refusal that kept its headers holds
	// them in every one.
	least := int64(math.MaxInt64)
	for attempt := range 3 {
		one := flood(1)
		eight := flood(controlplane.PreAuthRequests)
		perRefusal := (eight - one) / int64(conns*(controlplane.PreAuthRequests-1))
		t.Logf("measure %d: connections with one refusal waiting: %d KB; with eight: %d KB; %d KB a refusal", attempt+1, one>>10, eight>>10, perRefusal>>10)
		least = min(least, perRefusal)
		if least <= pad/4 {
			break
		}
	}
	if least > pad/4 {
		t.Errorf("a refusal waiting to be written holds %d KB of heap: its %d KB of headers are kept", least>>10, pad>>10)
	}
	for _, r := range rogues {
		_ = r.c.Close()
	}
}
