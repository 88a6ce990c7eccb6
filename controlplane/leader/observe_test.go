package leader_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/etcdtest"
)

// TestEtcdObserveFollowsTheLeader watches the election from a replica that
// never campaigns: it sees nobody, then each leader with the address it
// published, in order, and nobody again when the last one resigns.
func TestEtcdObserveFollowsTheLeader(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t) + "leader"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	watcher := &leader.Etcd{Client: newClient(t, cluster), Prefix: prefix, Identity: "watcher", Log: quiet}
	seen := make(chan leader.Candidate, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- watcher.Observe(ctx, func(c leader.Candidate) { seen <- c }) }()
	next := func(want leader.Candidate) {
		t.Helper()
		select {
		case got := <-seen:
			if got != want {
				t.Fatalf("observed %+v, want %+v", got, want)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("observed nothing within %v; want %+v", waitTimeout, want)
		}
	}
	next(leader.Candidate{})

	lead := func(identity, address string) (stop func()) {
		e := &leader.Etcd{Client: newClient(t, cluster), Prefix: prefix, Identity: identity, Address: address, TTL: time.Minute, Log: quiet}
		if self := e.Self(); self.Identity != identity || self.Address != address {
			t.Fatalf("Self() = %+v", self)
		}
		leadCtx, stopLead := context.WithCancel(t.Context())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			_ = e.Lead(leadCtx, func(ctx context.Context) error { <-ctx.Done(); return nil })
		}()
		return func() { stopLead(); <-ended }
	}
	a := leader.Candidate{Identity: "a", Address: "http://10.0.0.1:7420"}
	b := leader.Candidate{Identity: "b", Address: "http://10.0.0.2:7420"}
	stopA := lead(a.Identity, a.Address)
	next(a)
	stopB := lead(b.Identity, b.Address) // a candidate behind a
	client := newClient(t, cluster)
	deadline := time.Now().Add(waitTimeout)
	for {
		resp, err := client.Get(t.Context(), prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never campaigned")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopA() // a resigns: b leads
	next(b)
	if got, err := watcher.Current(t.Context()); err != nil || got != b {
		t.Fatalf("Current() = %+v, %v; want %+v", got, err, b)
	}
	stopB()
	next(leader.Candidate{})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Observe returned %v after its context ended, want nil", err)
	}
}
