package controlplane_test

import (
	"fmt"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// TestAUnaryHTTP2AnswerEndsWithItsOwnDataFrame: a unary answer over
// HTTP/2 is its HEADERS and one DATA frame that ends the stream — not a
// DATA frame and then an empty one to end it (what flushing the answer
// before its handler returned cost every call) — and the answer's slot
// (answersBounded) is given back once the stream is closed, so an honest
// client's calls, one after another, never run out of slots.
// TestRogue37BAnAgentCannotHoldManyUnreadAnswers holds the bound for a
// client granting no window.
func TestAUnaryHTTP2AnswerEndsWithItsOwnDataFrame(t *testing.T) {
	const share = 4
	rig := newHeldCallsRig(t, share, func(cfg *controlplane.Config) {})
	body, err := proto.Marshal(&tetherv1.GetNodeRequest{NodeId: rig.root.Node.NodeId})
	if err != nil {
		t.Fatal(err)
	}
	type frame struct {
		typ       http2.FrameType
		n         int
		endStream bool
	}
	var (
		mu     sync.Mutex
		frames = map[uint32][]frame{}
	)
	c := newH2ConnOn(t, dial(t, rig.addr), nil, func(_ *h2conn, f http2.Frame) {
		mu.Lock()
		defer mu.Unlock()
		switch f := f.(type) {
		case *http2.HeadersFrame:
			frames[f.StreamID] = append(frames[f.StreamID], frame{f.Type, 0, f.StreamEnded()})
		case *http2.DataFrame:
			frames[f.StreamID] = append(frames[f.StreamID], frame{f.Type, len(f.Data()), f.StreamEnded()})
		case *http2.RSTStreamFrame:
			frames[f.StreamID] = append(frames[f.StreamID], frame{f.Type, 0, true})
		}
	})
	t.Cleanup(func() { c.c.Close() })
	// Four times the caller's slots, one call at a time: each answer's
	// slot must be back before the next is written.
	const calls = 4 * (share + controlplane.BodyReserve)
	for i := range calls {
		c.mu.Lock()
		id, err := c.writeHeaders(tetherv1connect.AgentServiceGetNodeProcedure, "application/proto", rig.root.Credential, false)
		if err == nil {
			err = c.fr.WriteData(id, true, body)
		}
		c.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		ended := func() bool {
			mu.Lock()
			defer mu.Unlock()
			fs := frames[id]
			return len(fs) > 0 && fs[len(fs)-1].endStream
		}
		testserver.WaitFor(t, closeWait, fmt.Sprintf("call %d's answer to end its stream", i), ended)
		mu.Lock()
		fs := frames[id]
		mu.Unlock()
		if len(fs) != 2 || fs[0].typ != http2.FrameHeaders || fs[0].endStream ||
			fs[1].typ != http2.FrameData || fs[1].n == 0 || !fs[1].endStream {
			t.Fatalf("call %d's answer came as %+v; want HEADERS, then one DATA frame with the answer that ends the stream", i, fs)
		}
		testserver.WaitFor(t, closeWait, "the answer's slot to be given back", func() bool {
			own, shared := rig.srv.UnreadAnswers("agent:"+rig.root.Node.NodeId, rig.root.Node.NodeId)
			return own == 0 && shared == 0
		})
	}
}
