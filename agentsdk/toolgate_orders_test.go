package agentsdk

import (
	"context"
	"strconv"
	"testing"
)

// While begins are under way a gate holds the cancel orders for calls it
// has not registered, as one of them may be for the call a begin is about
// to return. A busy gate (an MCP gateway's, with begins always under way)
// fed orders for calls it never registers held them all, and each begin
// settled walked them; at most MaxEarlyOrders are held.
func TestAGateHoldsABoundedNumberOfEarlyOrdersWhileBeginsAreUnderWay(t *testing.T) {
	g := &ToolGate{inflight: map[string]context.CancelCauseFunc{}, orders: map[string]uint64{}, beginning: map[uint64]struct{}{}}
	g.begins = 1
	g.beginning[1] = struct{}{} // a begin under way, never settled here
	for i := range 100 * MaxEarlyOrders {
		g.cancel("c_unknown" + strconv.Itoa(i))
	}
	if n := g.HeldOrders(); n != MaxEarlyOrders {
		t.Fatalf("the gate holds %d orders for calls it has not registered, want %d", n, MaxEarlyOrders)
	}
	g.mu.Lock()
	g.settled(1)
	g.mu.Unlock()
	if n := g.HeldOrders(); n != 0 {
		t.Fatalf("the gate holds %d orders once no begin is under way, want 0", n)
	}
}
