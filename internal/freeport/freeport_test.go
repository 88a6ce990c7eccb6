package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Ports are distinct, bindable, and below the kernel's ephemeral range
// when there is room there: a listen on port 0 can never be handed one.
func TestPortsAreDistinctFreeAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Ports(32)
	if err != nil {
		t.Fatal(err)
	}
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice in %v", p, ports)
		}
		seen[p] = true
		if low > floor && (p < floor || p >= low) {
			t.Errorf("port %d is outside [%d, %d): a listen on port 0 may be given it", p, floor, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d was not free: %v", p, err)
			continue
		}
		l.Close()
	}
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		t.Errorf("Addr() = %q, want a loopback host:port", addr)
	}
}
