package controlplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/etcdtest"
)

const leadershipWait = 20 * time.Second

// shell is just enough of a Server to run its components.
func shell(elector leader.Elector) *Server {
	return &Server{cfg: Config{Elector: elector}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// leaderComponent returns the "leader" component of s.
func leaderComponent(t *testing.T, s *Server) component {
	t.Helper()
	for _, c := range s.runnableComponents() {
		if c.name == "leader" {
			return c
		}
	}
	t.Fatal("no leader component")
	return component{}
}

func TestLeaderOnlyComponentsWithoutElector(t *testing.T) {
	s := shell(nil)
	if got := s.runnableComponents(); len(got) != 0 {
		t.Fatalf("no components registered, %d runnable", len(got))
	}
	s.addComponent("everywhere", func(ctx context.Context) error { <-ctx.Done(); return nil })
	errBroken := errors.New("broken")
	ran := make(chan struct{})
	s.addLeaderComponent("scanner", func(ctx context.Context) error { <-ctx.Done(); return nil })
	s.addLeaderComponent("reconciler", func(context.Context) error { close(ran); return errBroken })
	runnable := s.runnableComponents()
	if len(runnable) != 2 || runnable[0].name != "everywhere" || runnable[1].name != "leader" {
		t.Fatalf("runnable components: %v", runnable)
	}
	// A single replica always leads; a leader-only component that fails
	// fails the group, and so the server, as any component does.
	err := runnable[1].run(t.Context())
	<-ran
	if !errors.Is(err, errBroken) || !strings.Contains(err.Error(), "reconciler") {
		t.Fatalf("leader group returned %v, want the failing component's error naming it", err)
	}
	s = shell(nil)
	s.addLeaderComponent("quits", func(context.Context) error { return nil })
	if err := leaderComponent(t, s).run(t.Context()); err == nil || !strings.Contains(err.Error(), "quits stopped") {
		t.Fatalf("a leader-only component that stops by itself: %v, want an error naming it", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s = shell(nil)
	s.addLeaderComponent("waits", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if err := leaderComponent(t, s).run(ctx); err != nil {
		t.Fatalf("leader group at shutdown returned %v, want nil", err)
	}
}

// TestLeaderOnlyComponentsFollowLeadership runs two replicas' leader groups
// on one etcd election: only the leader's components run; when its lease
// is revoked they are cancelled and the other replica's start; when the
// other stops, the first runs them again.
func TestLeaderOnlyComponentsFollowLeadership(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t) + "leader"
	client, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	type start struct {
		replica string
		ctx     context.Context
	}
	starts := make(chan start)
	type replica struct {
		cancel context.CancelFunc
		done   chan error
	}
	run := func(name string) replica {
		s := shell(&leader.Etcd{Client: client, Prefix: prefix, Identity: name, TTL: time.Minute,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		s.addLeaderComponent("reconciler", func(ctx context.Context) error {
			select {
			case starts <- start{name, ctx}:
			case <-ctx.Done():
			}
			<-ctx.Done()
			return ctx.Err()
		})
		ctx, cancel := context.WithCancel(context.Background())
		r := replica{cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- leaderComponent(t, s).run(ctx) }()
		return r
	}
	next := func() start {
		t.Helper()
		select {
		case s := <-starts:
			return s
		case <-time.After(leadershipWait):
			t.Fatal("no leader-only component started")
			return start{}
		}
	}
	waitCancelled := func(s start) {
		t.Helper()
		select {
		case <-s.ctx.Done():
		case <-time.After(leadershipWait):
			t.Fatalf("%s's component still runs after it lost leadership", s.replica)
		}
	}
	stop := func(r replica) {
		t.Helper()
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("leader group at shutdown returned %v", err)
			}
		case <-time.After(leadershipWait):
			t.Error("leader group did not stop")
		}
	}

	a := run("a")
	first := next()
	if first.replica != "a" {
		t.Fatalf("%s's component started, want a's, the only replica", first.replica)
	}
	b := run("b")

	// a loses its lease: its component is cancelled, b's starts.
	resp, err := client.Get(t.Context(), prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("leader key: %v", err)
	}
	if _, err := client.Revoke(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitCancelled(first)
	if second := next(); second.replica != "b" {
		t.Fatalf("%s's component started after a lost its lease, want b's", second.replica)
	}

	// a campaigned again; when b shuts down, a's component runs again.
	stop(b)
	if third := next(); third.replica != "a" {
		t.Fatalf("%s's component started after b stopped, want a's again", third.replica)
	}
	stop(a)
}
