package controlplane_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"

	"connectrpc.com/connect"
)

// TestRogue37BAnAgentCannotHoldManyUnreadAnswers: a rogue agent with a
// valid credential opens connections granting no flow-control window
// (SETTINGS_INITIAL_WINDOW_SIZE 0) and sends whole unary calls on them,
// 100 on each of four. Each call was admitted, charged one request and
// done; its answer then waited for the window until --write-timeout
// (30 s), its handler's goroutine, its answer and its stream held: a
// unary answer never read was bounded per connection only (by
// --max-streams-per-conn, 250), so a lineage held 250 on each of the
// connections it may hold (half of --max-connections), as many as its
// budget paid for in 30 s — some 320,000 at the default rate. Now the
// answers an agent's calls are writing are bounded as its calls waiting
// for their bodies are: --max-streams-per-caller per principal,
// --max-streams-per-lineage per lineage, each node BodyReserve of its
// own; an answer past them has its stream reset (its call was done and
// charged), and the rogue's sibling and another lineage are served.
// Measured by the goroutines the server's connections hold (a wide
// margin) and the answers the rogue sees begin or be reset, never by time.
func TestRogue37BAnAgentCannotHoldManyUnreadAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the goroutine measurement; make test and CI run them.")
	}
	const share = 16
	rig := newHeldCallsRig(t, share, func(cfg *controlplane.Config) {
		cfg.Conn.WriteTimeout = time.Hour // the answers are not cut short
	})
	srv, root, rogueC, sibling, siblingC, otherC, addr := rig.srv, rig.root, rig.rogueC, rig.sibling, rig.siblingC, rig.otherC, rig.addr
	body, err := proto.Marshal(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId})
	if err != nil {
		t.Fatal(err)
	}
	c0 := srv.ConnGoroutines()

	const conns, calls = 4, 100
	type windowless struct {
		*h2conn
		begun, rsts atomic.Int64 // answers whose headers arrived; streams reset
	}
	var rogues []*windowless
	for range conns {
		r := &windowless{}
		r.h2conn = newH2ConnOn(t, dial(t, addr), []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(_ *h2conn, f http2.Frame) {
			switch f.(type) {
			case *http2.HeadersFrame:
				r.begun.Add(1)
			case *http2.RSTStreamFrame:
				r.rsts.Add(1)
			}
		})
		t.Cleanup(func() { r.c.Close() })
		rogues = append(rogues, r)
	}
	for _, r := range rogues {
		r.mu.Lock()
		for range calls {
			id, err := r.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", root.Credential, false)
			if err == nil {
				err = r.fr.WriteData(id, true, body)
			}
			if err != nil {
				r.mu.Unlock()
				t.Fatal(err)
			}
		}
		r.mu.Unlock()
	}
	// Every call is answered: its answer begun (and held, waiting for the
	// window), or its stream reset.
	seen := func() (begun, rsts int64) {
		for _, r := range rogues {
			begun += r.begun.Load()
			rsts += r.rsts.Load()
		}
		return begun, rsts
	}
	testserver.WaitFor(t, closeWait, "every call of the rogue's to be answered or reset", func() bool {
		b, r := seen()
		return b+r >= conns*calls
	})
	held := share + controlplane.BodyReserve
	begun, rsts := seen()
	g := srv.ConnGoroutines()
	t.Logf("%d answers begun and held, %d streams reset; the server's connections hold %d goroutines (%d before)", begun, rsts, g, c0)
	rogueID := "agent:" + root.Node.NodeId
	if own, shared := srv.UnreadAnswers(rogueID, root.Node.NodeId); own != held || shared != share {
		t.Errorf("%d of the rogue's answers are being written, %d of its lineage's share: want %d and %d", own, shared, held, share)
	}
	if g > c0+held+conns*16+100 {
		t.Errorf("the server's connections hold %d goroutines (%d before) with the rogue's %d answers unread; at most %d may wait", g, c0, conns*calls, held)
	}
	// Its sibling (from its own reserve) and another lineage are served.
	if err := whoAmI(siblingC); err != nil {
		t.Errorf("the rogue's sibling's call: %v", err)
	}
	if err := whoAmI(otherC); err != nil {
		t.Errorf("another lineage's call: %v", err)
	}
	if _, err := siblingC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: sibling.Node.NodeId})); err != nil {
		t.Errorf("the rogue's sibling's GetNode: %v", err)
	}
	// Once its connections close, what they held is given back, and the
	// rogue's own calls are served again.
	for _, r := range rogues {
		_ = r.c.Close()
	}
	testserver.WaitFor(t, closeWait, "the rogue's held answers to be given back", func() bool {
		own, shared := srv.UnreadAnswers(rogueID, root.Node.NodeId)
		return own == 0 && shared == 0
	})
	if _, err := rogueC.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Errorf("with its connections closed, the rogue's own call: %v", err)
	}
}
