package controlplane_test

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// stallRogue speaks raw HTTP/2 and grants the server no flow-control
// window (SETTINGS_INITIAL_WINDOW_SIZE 0, no WINDOW_UPDATE): the server
// can send it headers, never a byte of an answer's body. It answers the
// server's pings, as a live peer does, and notes the streams the server
// ends (RST_STREAM, or a frame that ends the stream).
type stallRogue struct {
	*h2conn
	ended  sync.Map // stream id -> struct{}
	resets atomic.Int64
}

func newStallRogue(t *testing.T, addr string) *stallRogue {
	t.Helper()
	r := &stallRogue{}
	r.h2conn = newH2Conn(t, addr, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(c *h2conn, f http2.Frame) {
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
			r.resets.Add(1)
			r.ended.Store(f.StreamID, struct{}{})
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				r.ended.Store(f.StreamID, struct{}{})
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				r.ended.Store(f.StreamID, struct{}{})
			}
		}
	})
	return r
}

// open starts a streaming call of procedure with cred, its first message
// msg sent (and the request's end too when end is set).
func (r *stallRogue) open(t *testing.T, procedure, cred string, msg proto.Message, end bool) uint32 {
	t.Helper()
	body, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	env := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	copy(env[5:], body)
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := r.writeHeaders(procedure, "application/connect+proto", cred, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteData(id, end, env); err != nil {
		t.Fatal(err)
	}
	return id
}

func (r *stallRogue) isEnded(id uint32) bool {
	_, ok := r.ended.Load(id)
	return ok
}

// stallLimits: the default limits but a write timeout of a few seconds,
// long enough for a loaded machine to write a unary call's answer, short
// enough for the test to wait for a stalled stream's end.
func stallLimits(cfg *controlplane.Config) { cfg.Conn.WriteTimeout = closeWait / 4 }

// TestARogueGrantingNoWindowLosesItsStalledStreams: an authenticated rogue
// opens its revocation feed and a session on a connection that grants the
// server no flow-control window, and answers the server's pings. Each
// stream's first message can never be written: its handler waited in the
// write for as long as the connection lived — a goroutine and a stream
// slot held without end, past the rogue's own termination (which ends a
// stream through its context, and a write waiting for window does not look
// at it). Each message of a stream now has the write timeout to be taken;
// one the client does not take in time resets its stream, which gives its
// slot and goroutines back. Another agent's session is served throughout.
func TestARogueGrantingNoWindowLosesItsStalledStreams(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), stallLimits)
	admin := srv.AdminClients()
	root := register(t, admin, "rogue")
	other := register(t, admin, "other")
	addr := hostOf(t, srv.URL)
	// The goroutines serving the server's connections, not the
	// process's: on etcd the background components' goroutines grow by
	// themselves after the server answers (see ConnGoroutines).
	g0 := srv.ConnGoroutines()

	stalled := func(what string) {
		t.Helper()
		r := newStallRogue(t, addr)
		feed := r.open(t, tetherv1connect.CapabilityServiceWatchRevocationsProcedure, root.Credential, &tetherv1.WatchRevocationsRequest{}, true)
		session := r.open(t, tetherv1connect.AgentServiceSessionProcedure, root.Credential,
			&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: root.Node.NodeId}}}, false)
		testserver.WaitFor(t, closeWait, what+": the rogue's two streams to be counted", func() bool {
			return srv.OpenStreams("agent:"+root.Node.NodeId) == 2
		})
		if g := srv.ConnGoroutines(); g < g0+2 {
			t.Fatalf("%s: %d goroutines serving connections with the rogue's two streams open, %d before: the count misses their handlers", what, g, g0)
		}
		testserver.WaitFor(t, 2*closeWait, what+": the rogue's stalled streams to be ended", func() bool {
			return r.isEnded(feed) && r.isEnded(session)
		})
		testserver.WaitFor(t, closeWait, what+": the rogue's stream slots to be given back", func() bool {
			return srv.OpenStreams("agent:"+root.Node.NodeId) == 0
		})
		if r.isClosed() {
			t.Errorf("%s: the server closed the rogue's connection; only its stalled streams were to end", what)
		}
		r.c.Close()
		<-r.closed
		testserver.WaitFor(t, closeWait, what+": the streams' goroutines to be given back", func() bool {
			return srv.ConnGoroutines() <= g0+10
		})
	}

	// Another agent's session, open throughout, still answers.
	ctx, cancel := context.WithTimeout(context.Background(), 2*closeWait) // a guard against a hang, not a timing
	defer cancel()
	otherSession := srv.Clients(other.Credential).Agent.Session(ctx)
	defer func() { _ = otherSession.CloseRequest(); _ = otherSession.CloseResponse() }()
	if err := otherSession.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: other.Node.NodeId}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := otherSession.Receive(); err != nil {
		t.Fatalf("another agent's session: %v", err)
	}

	stalled("a live rogue")
	if err := otherSession.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Heartbeat{Heartbeat: &tetherv1.SessionHeartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := otherSession.Receive()
		if err != nil {
			t.Fatalf("another agent's session beside the stalled rogue: %v", err)
		}
		if m.GetHeartbeatAck() != nil {
			break
		}
	}

	// Terminated while its streams stall, the rogue keeps none of them.
	r := newStallRogue(t, addr)
	feed := r.open(t, tetherv1connect.CapabilityServiceWatchRevocationsProcedure, root.Credential, &tetherv1.WatchRevocationsRequest{}, true)
	testserver.WaitFor(t, closeWait, "the terminated rogue's stream to be counted", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 1
	})
	op := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, time.Second)
	testserver.WaitFor(t, closeWait, "the operator's abort to end", func() bool {
		clk.Advance(time.Second) // past each of its one-second deadlines
		return getTermination(t, admin, op.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	testserver.WaitFor(t, 2*closeWait, "the terminated rogue's stalled stream to be ended", func() bool { return r.isEnded(feed) })
	testserver.WaitFor(t, closeWait, "the terminated rogue's stream slot to be given back", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 0
	})
}
