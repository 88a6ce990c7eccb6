package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// A gate's cancel stream is read by the gate while its calls end. An order
// whose call ended (its gate reported it, the order's key deleted) before
// the stream got to it is no order any more: the gate no longer holds the
// call and would keep the order for a call it will never see again (the Go,
// TypeScript and Python gates keep early orders for calls not yet
// registered). A rogue agent whose calls end just as its stop orders them
// cancelled made each such call an entry kept for the gate's lifetime, on
// the gate and in the stream's own dedupe set on the server. Here the
// stream is held up on a first order while a second call is ordered
// cancelled and then ended: the stream must not send the second.
func TestACancelStreamSendsNoOrderForACallThatEndedBeforeItWasSent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l := &Ledger{Store: st, Clock: clk}
	const gate = "shell-gate"
	node := id.New(id.Node)
	first := &ToolCall{CallID: id.New(id.Call), NodeID: node, Tool: "shell", GateID: gate, State: CallStateInFlight, BegunAt: clk.Now(), BegunBy: "tool:" + gate}
	second := &ToolCall{CallID: id.New(id.Call), NodeID: node, Tool: "shell", GateID: gate, State: CallStateInFlight, BegunAt: clk.Now(), BegunBy: "tool:" + gate}
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := putCall(tx, first); err != nil {
			return err
		}
		return putCall(tx, second)
	}); err != nil {
		t.Fatal(err)
	}
	order := func(c *ToolCall) {
		t.Helper()
		if err := st.Update(ctx, func(tx store.Txn) error {
			cur, err := getCall(tx, c.CallID)
			if err != nil {
				return err
			}
			return RequestCancelIn(tx, cur, "t_1", clk.Now())
		}); err != nil {
			t.Fatal(err)
		}
	}

	sent := make(chan string, 4)
	release := make(chan struct{})
	watching := make(chan error, 1)
	go func() {
		watching <- l.WatchCancels(ctx, gate, func(c *ToolCall) error {
			sent <- c.CallID
			if c.CallID == first.CallID {
				<-release // the stream is held up on its first order
			}
			return nil
		})
	}()
	// Wait for the stream's watch to be in place: an order written now is
	// delivered through it (an order before it would come from its scan).
	order(first)
	if got := <-sent; got != first.CallID {
		t.Fatalf("first order for %s, want %s", got, first.CallID)
	}
	order(second)
	if _, err := l.End(ctx, second.CallID, gate, "tool:"+gate, false, ""); err != nil {
		t.Fatal(err)
	}
	close(release)
	// A third order, written after the second call ended, shows the stream
	// has moved past the second's order.
	third := &ToolCall{CallID: id.New(id.Call), NodeID: node, Tool: "shell", GateID: gate, State: CallStateInFlight, BegunAt: clk.Now(), BegunBy: "tool:" + gate}
	if err := st.Update(ctx, func(tx store.Txn) error { return putCall(tx, third) }); err != nil {
		t.Fatal(err)
	}
	order(third)
	for got := range sent {
		if got == second.CallID {
			t.Fatalf("the stream sent the order of call %s, which had ended before the stream reached it", got)
		}
		if got == third.CallID {
			break
		}
	}
	cancel()
	if err := <-watching; err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
}
