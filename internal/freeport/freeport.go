// Package freeport finds loopback ports for processes that bind them later,
// and again after a restart: a test's etcd members, `tether serve`
// subprocesses, the bench's servers.
//
// A port from a listen on port 0 lies in the kernel's ephemeral range
// (Linux's ip_local_port_range); once released it is the kernel's to hand
// to any other listen on port 0 (every test server of every test package
// running at once) or outgoing connection before the process binds it —
// which then exits "address already in use", most often on a restart.
// Ports here are picked at random below that range where there is room,
// so that test binaries running at once rarely try the same ones.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// floor is the lowest port picked.
const floor = 10000

// Ports returns n distinct loopback ports that were free a moment ago.
func Ports(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	low := ephemeralLow()
	for range n {
		var l net.Listener
		if low > floor {
			for range 64 {
				port := floor + rand.IntN(low-floor)
				if c, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
					l = c
					break
				}
			}
		}
		if l == nil {
			var err error
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, fmt.Errorf("freeport: find a free port: %w", err)
			}
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Addr returns a loopback address ("127.0.0.1:port") free a moment ago.
func Addr() (string, error) {
	ports, err := Ports(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux),
// or 0 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0
	}
	return low
}
