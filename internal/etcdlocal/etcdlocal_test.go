package etcdlocal_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
)

func TestBinaryFromEnvironment(t *testing.T) {
	t.Setenv(etcdlocal.BinaryEnv, "/nonexistent/etcd")
	if _, err := etcdlocal.Binary(); !errors.Is(err, etcdlocal.ErrNoBinary) {
		t.Fatalf("Binary with %s pointing nowhere: %v, want ErrNoBinary", etcdlocal.BinaryEnv, err)
	}
	_, err := etcdlocal.Start(t.Context(), etcdlocal.Config{Dir: t.TempDir()})
	if !errors.Is(err, etcdlocal.ErrNoBinary) {
		t.Fatalf("Start without a binary: %v, want ErrNoBinary", err)
	}
}

// TestMemberThatCannotStart checks that a member exiting at start-up fails
// Start at once, with the end of its log, instead of waiting out the
// timeout.
func TestMemberThatCannotStart(t *testing.T) {
	etcdtest.RequireBinary(t)
	start := time.Now()
	_, err := etcdlocal.Start(t.Context(), etcdlocal.Config{Dir: t.TempDir(), Flags: []string{"--no-such-flag"}, StartTimeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("Start with a bad flag: %v; want an error saying the member exited, with its log", err)
	}
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Fatalf("a member that exited at once took %v to report", elapsed)
	}
}

func TestClusterStopAndRestart(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	if len(c.Endpoints()) != 3 {
		t.Fatalf("endpoints %v, want 3", c.Endpoints())
	}
	m := c.Members[1]
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if m.Running() {
		t.Fatal("a stopped member runs")
	}
	if _, err := http.Get(m.ClientURL + "/health"); err == nil {
		t.Fatal("a stopped member still answers")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := m.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := m.Restart(ctx); err == nil {
		t.Fatal("restarting a running member succeeded")
	}
	if _, err := os.Stat(m.Dir + ".log"); err != nil {
		t.Fatalf("member log: %v", err)
	}
}

// TestMembersPortsAreNotTheKernelsToHandOut: a member's ports are below
// the kernel's ephemeral range, so that while it is killed no listen on
// port 0 (another test's server) and no outgoing connection can be given
// one of them, and Restart binds them again. They were the kernel's
// (listens on port 0): a restarted member could find its port taken and
// exit, "address already in use".
func TestMembersPortsAreNotTheKernelsToHandOut(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral port range to read here: %v", err)
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		t.Fatalf("ip_local_port_range %q: %v", b, err)
	}
	if low <= 10000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", low)
	}
	c := etcdtest.StartCluster(t, 2)
	for _, m := range c.Members {
		for _, raw := range []string{m.ClientURL, m.PeerURL} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			port, err := strconv.Atoi(u.Port())
			if err != nil {
				t.Fatal(err)
			}
			if port >= low && port <= high {
				t.Errorf("member %s listens on %s, in the kernel's ephemeral range %d-%d", m.Name, raw, low, high)
			}
		}
	}
}
