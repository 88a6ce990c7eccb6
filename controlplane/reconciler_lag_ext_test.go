package controlplane_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// laggingStore is the real Badger store whose open watches the test can end
// with ErrWatchLagged, as a backend ends the watch of a consumer that fell
// behind (Badger: a full buffer; etcd: a compacted revision). Everything
// else — reads, writes, new watches — is Badger's. Each watch remembers the
// functions that opened it, so the test can lag one component's watches.
type laggingStore struct {
	store.Store
	mu      sync.Mutex
	watches []*lagWatch
	held    map[string]chan struct{} // opener → closed when its new watches may open
	failed  map[string]error         // opener → the error its new watches fail with
	waiting map[string]int           // opener → its new watches waiting on a hold
}

type lagWatch struct {
	opener string // the opening goroutine's stack, function names only
	events chan []store.Event
	cut    chan struct{}
	once   sync.Once
	mu     sync.Mutex
	err    error
}

func (w *lagWatch) Events() <-chan []store.Event { return w.events }

func (w *lagWatch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (s *laggingStore) Watch(ctx context.Context, prefix []byte) (store.Watcher, error) {
	opener := openerStack()
	s.mu.Lock()
	var wait []chan struct{}
	for o, ch := range s.held {
		if strings.Contains(opener, o) {
			wait = append(wait, ch)
		}
	}
	for o, err := range s.failed {
		if strings.Contains(opener, o) {
			s.mu.Unlock()
			return nil, err
		}
	}
	if len(wait) > 0 {
		if s.waiting == nil {
			s.waiting = map[string]int{}
		}
		s.waiting[opener]++
	}
	s.mu.Unlock()
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	inner, err := s.Store.Watch(ctx, prefix)
	if err != nil {
		cancel()
		return nil, err
	}
	w := &lagWatch{opener: opener, events: make(chan []store.Event), cut: make(chan struct{})}
	s.mu.Lock()
	s.watches = append(s.watches, w)
	s.mu.Unlock()
	go func() {
		defer cancel()
		end := func(err error) {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			close(w.events)
		}
		for {
			select {
			case <-w.cut:
				end(store.ErrWatchLagged)
				return
			case batch, ok := <-inner.Events():
				if !ok {
					end(inner.Err())
					return
				}
				select {
				case w.events <- batch:
				case <-w.cut:
					end(store.ErrWatchLagged)
					return
				}
			}
		}
	}()
	return w, nil
}

// openerStack names the functions on the calling goroutine's stack.
func openerStack() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !more {
			return strings.Join(names, "\n")
		}
	}
}

// hold makes the new watches a function named opener opens wait until
// release is called: the component stays without a watch meanwhile.
func (s *laggingStore) hold(opener string) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	if s.held == nil {
		s.held = map[string]chan struct{}{}
	}
	s.held[opener] = ch
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.held, opener)
		s.mu.Unlock()
		close(ch)
	}
}

// fail makes the new watches a function named opener opens fail with err
// (a backend that could not open a watch: etcd without a quorum, say)
// until the returned function is called.
func (s *laggingStore) fail(opener string, err error) (heal func()) {
	s.mu.Lock()
	if s.failed == nil {
		s.failed = map[string]error{}
	}
	s.failed[opener] = err
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.failed, opener)
		s.mu.Unlock()
	}
}

// holding counts the new watches a function named opener asked for that
// waited (or wait) on a hold.
func (s *laggingStore) holding(opener string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for o, k := range s.waiting {
		if strings.Contains(o, opener) {
			n += k
		}
	}
	return n
}

// opened counts the watches a function named opener opened.
func (s *laggingStore) opened(opener string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.watches {
		if strings.Contains(w.opener, opener) {
			n++
		}
	}
	return n
}

// lag ends with ErrWatchLagged every open watch that a function named
// opener opened, and returns how many it ended.
func (s *laggingStore) lag(opener string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.watches {
		if strings.Contains(w.opener, opener) {
			w.once.Do(func() { close(w.cut) })
			n++
		}
	}
	return n
}

// A lagged watch loses events, not state: the termination reconciler
// re-establishes its watches and rescans, so a change made after the lag
// (here the exit confirmation a reconciling termination waits for) still
// moves the termination on. Before, its watch goroutines simply ended and
// the termination stayed in reconciling until its deadline.
func TestTerminationSurvivesALaggedWatch(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	st := &laggingStore{Store: b}
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	root := register(t, admin, "worker")

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)

	// Only the termination reconciler's watches lag: how every other
	// component survives a lag is its own test.
	// Its five: the ledger's keys that may move a termination (a call, a
	// termination's calls, its refused calls), the nodes, the terminations.
	if n := st.lag("supervisor.(*Supervisor).Run"); n != 5 {
		t.Fatalf("lagged %d of the termination reconciler's watches, want its 5", n)
	}
	if _, err := admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	// The manual clock does not move: only the confirmation can finish it.
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
}

// A lagged watch loses events, not state, for the session signals too: an
// abort decided while their watch was down still reaches the agent's open
// session once the watch is back (the signals rescan the open sessions'
// nodes). Before, the re-established watch waited for the next change, and
// the session never heard of the abort.
func TestSessionSignalSurvivesALaggedWatch(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &laggingStore{Store: b}
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	root := register(t, admin, "worker")
	// A bound so that a missing signal fails the test instead of hanging
	// it; nothing waits for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := srv.Clients(root.Credential).Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetOpened() == nil {
		t.Fatalf("first message %v (%v)", stream.Msg(), stream.Err())
	}

	const signals = "tree.(*Signals).Run"
	release := st.hold(signals)
	if n := st.lag(signals); n != 1 {
		t.Fatalf("lagged %d of the session signals' watches, want its 1", n)
	}
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Minute, time.Minute)
	// The abort is decided once the node is marked; the termination may
	// already have moved on to reconciling (nothing to cancel), so wait
	// on the node, which stays aborting.
	testserver.WaitFor(t, 20*time.Second, "the node to be aborting", func() bool {
		return getNode(t, admin, root.Node.NodeId).State == tetherv1.NodeState_NODE_STATE_ABORTING
	})
	release()
	if sig := nextSignal(t, stream); sig.Kind != tetherv1.SignalKind_SIGNAL_KIND_ABORT || sig.TerminationId != term.TerminationId {
		t.Fatalf("pushed %v, want abort of %s", sig, term.TerminationId)
	}
}
