package etcdstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

// serverWatchers is how many watchers the etcd cluster holds, summed over
// its members: a client's watches may be served by any member (and by
// several, as it fails over), so one member's count says nothing.
func serverWatchers(t *testing.T, cluster *etcdlocal.Cluster) int {
	t.Helper()
	total := 0
	for _, m := range cluster.Members {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.ClientURL+"/metrics", nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("metrics of member %s: %v", m.Name, err)
		}
		found := false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			value, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total ")
			if !ok {
				continue
			}
			n, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("member %s: watcher count %q: %v", m.Name, value, err)
			}
			total += int(n)
			found = true
		}
		resp.Body.Close()
		cancel()
		if !found {
			t.Fatalf("member %s does not report etcd_debugging_mvcc_watcher_total", m.Name)
		}
	}
	return total
}

// TestEtcdWatchesOfOnePrefixShareOneEtcdWatch: every component of a
// server that follows a prefix (the session signals, the stop rules, the
// census and the reconcilers all follow the nodes) had an etcd watch of
// its own, so each change of a node crossed the network, and was decoded,
// once per component — at 10,000 agents a termination received 111,161
// watch events for about 30,000 changes. The process now keeps one etcd
// watch per prefix and fans its events out: five Watches of one prefix and
// one of another cost the cluster two watchers (six before), and a change
// is received once (five times before), each Watch still delivering it.
func TestEtcdWatchesOfOnePrefixShareOneEtcdWatch(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster)
	base := serverWatchers(t, cluster)

	const shared = 5
	var ws []store.Watcher
	for range shared {
		w, err := s.Watch(t.Context(), []byte("node/"))
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	other, err := s.Watch(t.Context(), []byte("rule/"))
	if err != nil {
		t.Fatal(err)
	}
	before := s.Stats().WatchEvents
	mustPut(t, s, "node/a", "1")
	mustPut(t, s, "rule/r", "1")
	// Each Watch delivers its change: the etcd watchers are established
	// on the server by then.
	for i, w := range append(ws, other) {
		want := "node/a"
		if i == shared {
			want = "rule/r"
		}
		select {
		case batch, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch %d ended: %v", i, w.Err())
			}
			if len(batch) != 1 || string(batch[0].Key) != want {
				t.Fatalf("watch %d delivered %v, want one event for %s", i, batch, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("watch %d delivered nothing for %s", i, want)
		}
	}
	if got := serverWatchers(t, cluster) - base; got != 2 {
		t.Errorf("six Watches of two prefixes hold %d watchers on the etcd cluster, want 2 (one per prefix)", got)
	}
	if got := s.Stats().WatchEvents - before; got != 2 {
		t.Errorf("two changes were received %d times from etcd, want 2 (once each)", got)
	}
	if got := s.Watches(); got != shared+1 {
		t.Errorf("Watches() = %d, want %d", got, shared+1)
	}
}

// TestEtcdSharedWatchEndsEachWatchOnItsOwn: a Watch that shares its etcd
// watch with others still ends on its own — when its context ends, or
// when it falls WatchBuffer transactions behind — without ending the
// others; a Watch opened later delivers only what was committed after it,
// never a change the shared watch delivered before; and when the last
// Watch of a prefix ends, so does the etcd watch.
func TestEtcdSharedWatchEndsEachWatchOnItsOwn(t *testing.T) {
	cluster := etcdtest.Start(t)
	s := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.WatchBuffer = 2 })
	base := serverWatchers(t, cluster)

	reader, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	laggard, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	leaver, err := s.Watch(cancelled, []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	expectEnded(t, leaver, context.Canceled)

	receive := func(w store.Watcher, want string) {
		t.Helper()
		select {
		case batch, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended: %v", w.Err())
			}
			if string(batch[0].Key) != want {
				t.Fatalf("event for %s, want %s", batch[0].Key, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no event for %s", want)
		}
	}
	for i := range 3 {
		key := fmt.Sprintf("k/%d", i)
		mustPut(t, s, key, "v")
		receive(reader, key)
	}
	// The laggard read none of three transactions with a buffer of two.
	// (Its end is awaited before its buffer is read: the reader may get
	// the third before the laggard's turn comes, and a buffer read
	// meanwhile would make room for it.)
	waitEnded(t, laggard)
	expectEnded(t, laggard, store.ErrWatchLagged)

	late, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "k/3", "v")
	receive(reader, "k/3")
	receive(late, "k/3")
	if got := serverWatchers(t, cluster) - base; got != 1 {
		t.Errorf("the Watches of one prefix hold %d watchers on the etcd cluster, want 1", got)
	}

	// The last Watch of the prefix ends: so does its etcd watch (the
	// server lets go of it after the client cancels it, hence the wait).
	stop, stopAll := context.WithCancel(t.Context())
	third, err := s.Watch(stop, []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	_ = third
	stopAll()
	expectEnded(t, third, context.Canceled)
	if got := s.Watches(); got != 2 {
		t.Fatalf("Watches() = %d after one of three ended, want 2", got)
	}
	waitWatchers(t, cluster, base+1)
}

// waitWatchers waits until the cluster holds want watchers; the wait only
// guards against a hang.
func waitWatchers(t *testing.T, cluster *etcdlocal.Cluster, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := serverWatchers(t, cluster)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the etcd cluster holds %d watchers, want %d", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEnded waits, without reading its events, until w has ended; the
// wait only guards against a hang.
func waitEnded(t *testing.T, w store.Watcher) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for w.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not end")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func expectEnded(t *testing.T, w store.Watcher, want error) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case _, ok := <-w.Events():
			if ok {
				continue
			}
			if err := w.Err(); !errors.Is(err, want) {
				t.Fatalf("watch ended with %v, want %v", err, want)
			}
			return
		case <-deadline:
			t.Fatalf("watch did not end (want %v)", want)
		}
	}
}
