package agentsdk

import (
	"context"
	"strconv"
	"testing"
)

// A gate keeps the cancel orders for calls it does not hold: one that came
// before the call's BeginCall answer, taken when the call registers, and
// one that came after its call ended, never taken. A long-lived gate (an
// MCP gateway's) whose agents' calls end just as their stops order them
// cancelled kept every such order for its lifetime. Past MaxEarlyOrders the
// oldest is forgotten; a fresh order still reaches the call that registers
// after it, and an order taken is not taken twice.
func TestAGateKeepsABoundedNumberOfOrdersForCallsItDoesNotHold(t *testing.T) {
	g := &ToolGate{inflight: map[string]context.CancelCauseFunc{}}
	for i := range 100 * MaxEarlyOrders {
		g.cancel("c_gone" + strconv.Itoa(i))
	}
	if n := len(g.orders.set); n > MaxEarlyOrders {
		t.Fatalf("the gate keeps %d orders for calls it does not hold, want at most %d", n, MaxEarlyOrders)
	}
	if n := len(g.orders.queue); n > 2*MaxEarlyOrders {
		t.Fatalf("the gate's order queue holds %d ids, want at most %d", n, 2*MaxEarlyOrders)
	}
	g.cancel("c_early")
	if !g.orders.take("c_early") {
		t.Fatal("the order that came just before its call registered was forgotten")
	}
	if g.orders.take("c_early") {
		t.Fatal("an order was taken twice")
	}
	// Orders taken as their calls register leave no trace behind.
	for i := range 10 * MaxEarlyOrders {
		id := "c_soon" + strconv.Itoa(i)
		g.cancel(id)
		if !g.orders.take(id) {
			t.Fatalf("order %s was forgotten before its call registered", id)
		}
	}
	if n := len(g.orders.queue); n > 2*MaxEarlyOrders {
		t.Fatalf("the gate's order queue holds %d ids after the orders were taken, want at most %d", n, 2*MaxEarlyOrders)
	}
}
