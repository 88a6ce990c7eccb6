package leader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
)

const waitTimeout = 20 * time.Second

func TestAlwaysLeads(t *testing.T) {
	errBoom := errors.New("boom")
	if err := (leader.Always{}).Lead(t.Context(), func(context.Context) error { return errBoom }); err != errBoom {
		t.Fatalf("Always.Lead returned %v, want fn's error", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	err := (leader.Always{}).Lead(ctx, func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil {
		t.Fatalf("Always.Lead after its context ended returned %v, want nil", err)
	}
}

// replica is one elector campaigning in the background, reporting each
// term it gets.
type replica struct {
	name     string
	client   *clientv3.Client
	elector  *leader.Etcd
	cancel   context.CancelFunc
	result   chan error
	terms    chan term // a term starts
	mu       sync.Mutex
	leading  bool
	endCause error
}

type term struct {
	replica *replica
	ended   chan struct{}
}

func newClient(t *testing.T, cluster *etcdlocal.Cluster) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startReplica campaigns as name until stopped; its terms are announced
// on terms.
func startReplica(t *testing.T, cluster *etcdlocal.Cluster, prefix, name string, ttl time.Duration, terms chan term) *replica {
	t.Helper()
	r := &replica{name: name, client: newClient(t, cluster), result: make(chan error, 1), terms: terms}
	r.elector = &leader.Etcd{Client: r.client, Prefix: prefix, Identity: name, TTL: ttl,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.result <- r.elector.Lead(ctx, func(ctx context.Context) error {
			r.mu.Lock()
			r.leading = true
			r.mu.Unlock()
			ended := make(chan struct{})
			select {
			case terms <- term{replica: r, ended: ended}:
			case <-ctx.Done():
			}
			<-ctx.Done()
			r.mu.Lock()
			r.leading, r.endCause = false, context.Cause(ctx)
			r.mu.Unlock()
			close(ended)
			return ctx.Err()
		})
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the replica's Lead and checks it returned nil.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.result:
		if err != nil {
			t.Errorf("%s: Lead returned %v after its context ended, want nil", r.name, err)
		}
	case <-time.After(waitTimeout):
		t.Errorf("%s: Lead did not return after its context ended", r.name)
	}
}

func nextTerm(t *testing.T, terms chan term) term {
	t.Helper()
	select {
	case tm := <-terms:
		return tm
	case <-time.After(waitTimeout):
		t.Fatalf("no replica became the leader within %v", waitTimeout)
		return term{}
	}
}

func waitEnded(t *testing.T, tm term) {
	t.Helper()
	select {
	case <-tm.ended:
	case <-time.After(waitTimeout):
		t.Fatalf("%s still leads %v after it should have lost leadership", tm.replica.name, waitTimeout)
	}
}

// TestEtcdElection runs three replicas through the ways a leader goes: it
// resigns at shutdown (the next takes over at once, long before the TTL),
// its lease is revoked (it notices, steps down and campaigns again), and it
// dies silently (the next takes over after the TTL).
func TestEtcdElection(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t) + "leader"
	terms := make(chan term)
	const longTTL = time.Minute // a handover that waited for it would time the test out
	replicas := map[string]*replica{}
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i)
		replicas[name] = startReplica(t, cluster, prefix, name, longTTL, terms)
	}

	first := nextTerm(t, terms)
	who, err := first.replica.elector.Leader(t.Context())
	if err != nil || who != first.replica.name {
		t.Fatalf("Leader() = %q, %v while %s leads", who, err, first.replica.name)
	}
	for name, r := range replicas {
		r.mu.Lock()
		leading := r.leading
		r.mu.Unlock()
		if leading != (name == first.replica.name) {
			t.Fatalf("%s leading = %v while %s leads", name, leading, first.replica.name)
		}
	}

	// 1. Shutdown: the leader resigns; the next leads without waiting out
	// the minute-long TTL.
	first.replica.stop(t)
	waitEnded(t, first)
	second := nextTerm(t, terms)
	if second.replica == first.replica {
		t.Fatal("a stopped replica led again")
	}

	// 2. Its lease revoked from outside (as etcd does when it expires):
	// the leader's term ends with the reason, another leads, and the old
	// leader campaigns again.
	key, err := second.replica.client.Get(t.Context(), prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(key.Kvs) == 0 {
		t.Fatalf("leader key: %v", err)
	}
	if _, err := newClient(t, cluster).Revoke(t.Context(), clientv3.LeaseID(key.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, second)
	second.replica.mu.Lock()
	cause := second.replica.endCause
	second.replica.mu.Unlock()
	if !errors.Is(cause, leader.ErrKeyDeleted) && !errors.Is(cause, leader.ErrSessionExpired) {
		t.Fatalf("the revoked leader's term ended with %v, want ErrKeyDeleted or ErrSessionExpired", cause)
	}
	third := nextTerm(t, terms)
	if third.replica == second.replica {
		// The other candidate was queued first, so it must win.
		t.Fatalf("%s led again before the waiting candidate", third.replica.name)
	}

	// The revoked replica is a candidate again: when the leader goes, it
	// leads.
	third.replica.stop(t)
	waitEnded(t, third)
	if fourth := nextTerm(t, terms); fourth.replica != second.replica {
		t.Fatalf("%s leads; want %s, which campaigned again after losing its lease", fourth.replica.name, second.replica.name)
	}
}

// TestEtcdLeaderDiesSilently cuts a leader off without resigning (its
// client closes, so its lease is no longer renewed): after the TTL, the
// other replica leads.
func TestEtcdLeaderDiesSilently(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t) + "leader"
	terms := make(chan term)
	const ttl = 2 * time.Second
	a := startReplica(t, cluster, prefix, "a", ttl, terms)
	first := nextTerm(t, terms)
	b := startReplica(t, cluster, prefix, "b", ttl, terms)
	if first.replica != a {
		t.Fatalf("%s leads, want a, the only candidate", first.replica.name)
	}
	a.client.Close() // no resign, no revoke, no more keepalives
	second := nextTerm(t, terms)
	if second.replica != b {
		t.Fatalf("%s leads after a died, want b", second.replica.name)
	}
	waitEnded(t, first) // a notices it is no longer leader
}

// TestEtcdWorkThatEndsEndsLead checks that a function returning while its
// replica leads ends Lead with its result.
func TestEtcdWorkThatEndsEndsLead(t *testing.T) {
	cluster := etcdtest.Start(t)
	e := &leader.Etcd{Client: newClient(t, cluster), Prefix: etcdtest.Prefix(t) + "leader", Identity: "solo",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	errBroken := errors.New("component failed")
	if err := e.Lead(t.Context(), func(context.Context) error { return errBroken }); err != errBroken {
		t.Fatalf("Lead returned %v, want the function's error", err)
	}
	// It resigned on the way out.
	if who, err := e.Leader(t.Context()); !errors.Is(err, leader.ErrNoLeader) {
		t.Fatalf("after Lead returned, Leader() = %q, %v; want ErrNoLeader", who, err)
	}
	if err := (&leader.Etcd{}).Lead(t.Context(), func(context.Context) error { return nil }); err == nil {
		t.Fatal("an elector without a client led")
	}
}
