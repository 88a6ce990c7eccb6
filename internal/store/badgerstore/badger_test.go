package badgerstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/internal/store/storetest"
)

const waitTimeout = 10 * time.Second

func testOptions(t *testing.T) badgerstore.BadgerOptions {
	return badgerstore.BadgerOptions{
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

func openBadger(t *testing.T, dir string, opts badgerstore.BadgerOptions) *badgerstore.Badger {
	t.Helper()
	s, err := badgerstore.OpenBadger(dir, opts)
	if err != nil {
		t.Fatalf("OpenBadger: %v", err)
	}
	t.Cleanup(func() { closeWithin(t, s) })
	return s
}

// closeWithin closes s, failing the test instead of hanging it if Close
// does not return in time (say, because the committer is stuck).
func closeWithin(t *testing.T, s *badgerstore.Badger) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Errorf("Close did not return within %v", waitTimeout)
	}
}

func TestBadgerConformance(t *testing.T) {
	t.Run("OnDisk", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return openBadger(t, t.TempDir(), testOptions(t))
		})
	})
	t.Run("InMemory", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			opts := testOptions(t)
			opts.InMemory = true
			return openBadger(t, "", opts)
		})
	})
}

func TestOpenBadgerInMemory(t *testing.T) {
	s, err := badgerstore.OpenBadgerInMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put(t, s, "k", "v")
	if got := get(t, s, "k"); got != "v" {
		t.Fatalf("k = %q, want v", got)
	}
}

func TestOpenBadgerRejectsBadOptions(t *testing.T) {
	for name, open := range map[string]func() (*badgerstore.Badger, error){
		"in-memory with a directory": func() (*badgerstore.Badger, error) {
			return badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{InMemory: true})
		},
		"no directory on disk": func() (*badgerstore.Badger, error) {
			return badgerstore.OpenBadger("", badgerstore.BadgerOptions{})
		},
		"tiny memtable": func() (*badgerstore.Badger, error) {
			return badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{MemTableSize: 1 << 20})
		},
	} {
		if s, err := open(); err == nil {
			s.Close()
			t.Errorf("%s: OpenBadger succeeded, want an error", name)
		}
	}
}

func TestBadgerReservesBadgerKeys(t *testing.T) {
	s := openBadger(t, "", inMemory(t))
	err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put([]byte("!badger!head"), []byte("x")) })
	if !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("Put of a Badger-internal key: %v, want ErrInvalidKey", err)
	}
}

// TestBadgerReopenSeesAcknowledgedWrites closes a store under concurrent
// writers' acknowledged Updates and checks all of them, and the revision,
// survive a reopen.
func TestBadgerReopenSeesAcknowledgedWrites(t *testing.T) {
	dir := t.TempDir()
	const writers, each = 32, 20
	s, err := badgerstore.OpenBadger(dir, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("k/%02d/%02d", g, i)
				if err := s.Update(context.Background(), func(tx store.Txn) error {
					return tx.Put([]byte(key), []byte(key))
				}); err != nil {
					t.Errorf("Update: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	rev := revision(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openBadger(t, dir, testOptions(t))
	if got := revision(t, s); got != rev || rev != writers*each {
		t.Fatalf("revision %d before Close, %d after reopen; want %d both", rev, got, writers*each)
	}
	n := 0
	err = s.View(t.Context(), func(tx store.ReadTxn) error {
		return tx.Scan([]byte("k/"), nil, func(k, v []byte) error {
			if !bytes.Equal(k, v) {
				return fmt.Errorf("%s = %s", k, v)
			}
			n++
			return nil
		})
	})
	if err != nil || n != writers*each {
		t.Fatalf("after reopen: %d keys (err %v), want %d", n, err, writers*each)
	}
	put(t, s, "after", "reopen")
	if got := revision(t, s); got != rev+1 {
		t.Fatalf("first Update after reopen got revision %d, want %d", got, rev+1)
	}
}

const crashHelperEnv = "TETHER_STORE_CRASH_HELPER_DIR"

// TestBadgerCrashHelper is the child of TestBadgerCrashKeepsAcknowledgedWrites:
// it writes until killed and reports each acknowledged key on stdout.
func TestBadgerCrashHelper(t *testing.T) {
	dir := os.Getenv(crashHelperEnv)
	if dir == "" {
		t.Skip("helper process for TestBadgerCrashKeepsAcknowledgedWrites")
	}
	s, err := badgerstore.OpenBadger(dir, badgerstore.BadgerOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	var stdout sync.Mutex
	for g := range 16 {
		go func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("crash/%02d/%07d", g, i)
				err := s.Update(context.Background(), func(tx store.Txn) error {
					return tx.Put([]byte(key), bytes.Repeat([]byte{'v'}, 200))
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "update:", err)
					os.Exit(2)
				}
				// One write(2) per line, after the acknowledgement: what
				// the parent reads was acknowledged.
				stdout.Lock()
				fmt.Fprintf(os.Stdout, "ack %s\n", key)
				stdout.Unlock()
			}
		}()
	}
	select {}
}

// TestBadgerCrashKeepsAcknowledgedWrites kills a writing process with
// SIGKILL and checks that every write it acknowledged is there after
// reopening. SIGKILL does not drop the page cache, so this proves that
// acknowledgements wait for the write and that recovery replays it, not
// that the sync reaches the platter; that part is Badger's SyncWrites.
func TestBadgerCrashKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a writer process")
	}
	const killAfter = 3000
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBadgerCrashHelper$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	t.Cleanup(kill)

	var acked []string
	lines := bufio.NewReader(stdout)
	for {
		line, err := lines.ReadString('\n')
		if err == io.EOF {
			break // a fragment without its newline is not an acknowledgement
		}
		if err != nil {
			t.Fatalf("reading the helper's output: %v", err)
		}
		if key, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "ack "); ok {
			acked = append(acked, key)
			if len(acked) == killAfter {
				kill()
			}
		}
	}
	err = cmd.Wait()
	status, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !status.Signaled() || status.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v before it was killed; stderr:\n%s", err, stderr.Bytes())
	}
	if len(acked) < killAfter {
		t.Fatalf("helper acknowledged only %d writes", len(acked))
	}

	s := openBadger(t, dir, testOptions(t))
	var missing []string
	err = s.View(t.Context(), func(tx store.ReadTxn) error {
		for _, key := range acked {
			_, err := tx.Get([]byte(key))
			if errors.Is(err, store.ErrNotFound) {
				missing = append(missing, key)
				continue
			}
			if err != nil {
				return err
			}
		}
		if rev := tx.Revision(); rev < uint64(len(acked)) {
			return fmt.Errorf("revision %d is below the %d acknowledged Updates", rev, len(acked))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost in the crash, e.g. %q", len(missing), len(acked), missing[0])
	}
	t.Logf("all %d acknowledged writes survived SIGKILL", len(acked))
}

// TestBadgerGroupCommit queues Updates behind a busy committer and checks
// that they share one group commit.
func TestBadgerGroupCommit(t *testing.T) {
	s := openBadger(t, t.TempDir(), testOptions(t))
	release := holdCommitter(t, s)
	const queued = 10
	results := startUpdates(t, s, queued, func(i int) func(store.Txn) error {
		return func(tx store.Txn) error { return tx.Put(fmt.Appendf(nil, "k/%d", i), []byte("v")) }
	})
	before := s.Stats()
	release()
	for i, err := range collectResults(t, results) {
		if err != nil {
			t.Fatalf("Update %d: %v", i, err)
		}
	}
	after := s.Stats()
	if got := after.Batches - before.Batches; got != 1 {
		t.Fatalf("%d queued Updates took %d group commits, want 1", queued, got)
	}
	if got := after.Transactions - before.Transactions; got != 1 {
		t.Fatalf("%d small Updates took %d Badger transactions, want 1", queued, got)
	}
	if got := after.Updates - before.Updates - 1; got != queued { // less the holder
		t.Fatalf("Stats counted %d acknowledged Updates, want %d", got, queued)
	}
}

// TestBadgerSplitsBatchTooBigForOneTransaction queues more data than one
// Badger transaction holds behind a busy committer: the batch must be
// committed as several transactions, all of it acknowledged and durable.
func TestBadgerSplitsBatchTooBigForOneTransaction(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t)
	opts.MemTableSize = 8 << 20 // one transaction holds about 1.2 MiB
	s, err := badgerstore.OpenBadger(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(t.Context(), []byte("big/"))
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("v"), 200<<10)

	release := holdCommitter(t, s)
	const queued = 24 // 4.8 MiB in all
	results := startUpdates(t, s, queued, func(i int) func(store.Txn) error {
		return func(tx store.Txn) error { return tx.Put(fmt.Appendf(nil, "big/%02d", i), value) }
	})
	before := s.Stats()
	release()
	for i, err := range collectResults(t, results) {
		if err != nil {
			t.Fatalf("Update %d: %v", i, err)
		}
	}
	after := s.Stats()
	if got := after.Batches - before.Batches; got != 1 {
		t.Fatalf("the queued Updates took %d group commits, want 1", got)
	}
	if got := after.Transactions - before.Transactions; got < 4 {
		t.Fatalf("4.8 MiB went into %d Badger transactions; want at least 4 of at most 1.2 MiB", got)
	}
	// Every Update kept its own revision, delivered in commit order.
	last := uint64(0)
	for range queued {
		select {
		case batch := <-w.Events():
			if len(batch) != 1 || batch[0].Revision <= last {
				t.Fatalf("watch batch %v after revision %d", batch, last)
			}
			last = batch[0].Revision
		case <-time.After(waitTimeout):
			t.Fatal("watch events missing")
		}
	}

	// One Update bigger than a transaction cannot be split atomically.
	err = s.Update(t.Context(), func(tx store.Txn) error {
		for i := range 8 {
			if err := tx.Put(fmt.Appendf(nil, "huge/%d", i), value); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Update of 1.6 MiB with a 1.2 MiB transaction limit: %v, want ErrTooLarge", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openBadger(t, dir, opts)
	for i := range queued {
		if got := get(t, s, fmt.Sprintf("big/%02d", i)); got != string(value) {
			t.Fatalf("big/%02d has %d bytes after reopen, want %d", i, len(got), len(value))
		}
	}
	if got := revision(t, s); got != last {
		t.Fatalf("revision after reopen %d, want %d", got, last)
	}
}

// TestBadgerPanickingFunction checks that a panic fails only its own Update,
// even inside a group commit, and that the committer keeps going.
func TestBadgerPanickingFunction(t *testing.T) {
	s := openBadger(t, "", inMemory(t))
	put(t, s, "seed", "1")
	release := holdCommitter(t, s)
	results := startUpdates(t, s, 3, func(i int) func(store.Txn) error {
		switch i {
		case 1:
			return func(tx store.Txn) error {
				if err := tx.Put([]byte("from-panic"), []byte("x")); err != nil {
					return err
				}
				panic("boom")
			}
		default:
			return func(tx store.Txn) error {
				if _, err := tx.Get([]byte("from-panic")); !errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("a later Update sees the panicking one's write (%v)", err)
				}
				return tx.Put(fmt.Appendf(nil, "ok/%d", i), []byte("v"))
			}
		}
	})
	before := s.Stats()
	release()
	errs := collectResults(t, results)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("Updates beside the panicking one failed: %v, %v", errs[0], errs[2])
	}
	if !errors.Is(errs[1], store.ErrPanicked) || !strings.Contains(errs[1].Error(), "boom") {
		t.Fatalf("panicking Update returned %v, want ErrPanicked with the panic value", errs[1])
	}
	if got := s.Stats().Batches - before.Batches; got != 1 {
		t.Fatalf("took %d group commits, want the three Updates in one", got)
	}
	if _, ok := lookup(t, s, "from-panic"); ok {
		t.Fatal("the panicking Update's write was committed")
	}
	put(t, s, "later", "1")
	if got := get(t, s, "ok/0") + get(t, s, "ok/2") + get(t, s, "later"); got != "vv1" {
		t.Fatalf("writes around the panic: %q", got)
	}
}

// TestBadgerContextCancelWhileQueued checks both sides of the cancellation
// rule: cancelled while queued means never run; started means completed.
func TestBadgerContextCancelWhileQueued(t *testing.T) {
	s := openBadger(t, "", inMemory(t))
	release := holdCommitter(t, s)

	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{}, 1)
	result := make(chan error, 1)
	go func() {
		result <- s.Update(ctx, func(tx store.Txn) error {
			ran <- struct{}{}
			return tx.Put([]byte("cancelled"), []byte("x"))
		})
	}()
	waitQueued(t, s, 1)
	cancel()
	// The committer is still held: Update must return without it.
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Update cancelled in the queue returned %v, want context.Canceled", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Update cancelled in the queue did not return")
	}
	release()
	put(t, s, "barrier", "1") // the committer has passed the cancelled request
	select {
	case <-ran:
		t.Fatal("the cancelled Update's function ran")
	default:
	}
	if _, ok := lookup(t, s, "cancelled"); ok {
		t.Fatal("the cancelled Update wrote")
	}

	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	err := s.Update(ctx, func(tx store.Txn) error {
		cancel() // too late: the function has started
		return tx.Put([]byte("started"), []byte("x"))
	})
	if err != nil {
		t.Fatalf("Update whose context ended after it started: %v, want nil", err)
	}
	if got := get(t, s, "started"); got != "x" {
		t.Fatalf("started = %q, want x", got)
	}
}

// doneUnnoticed is a context whose Err reports cancellation before its Done
// channel closes: the moment in which a cancelled caller has not yet woken
// up to notice.
type doneUnnoticed struct {
	context.Context
	cancelled chan struct{}
}

func (c doneUnnoticed) Done() <-chan struct{} { return nil }

func (c doneUnnoticed) Err() error {
	select {
	case <-c.cancelled:
		return context.Canceled
	default:
		return nil
	}
}

// TestBadgerCommitterChecksContext checks that the committer itself skips a
// request whose context ended while it was queued, even if the caller has
// not noticed yet.
func TestBadgerCommitterChecksContext(t *testing.T) {
	s := openBadger(t, "", inMemory(t))
	release := holdCommitter(t, s)
	ctx := doneUnnoticed{Context: context.Background(), cancelled: make(chan struct{})}
	result := make(chan error, 1)
	go func() {
		result <- s.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte("k"), []byte("v")) })
	}()
	waitQueued(t, s, 1)
	close(ctx.cancelled)
	release()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Update returned %v, want context.Canceled", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Update did not return")
	}
	if _, ok := lookup(t, s, "k"); ok {
		t.Fatal("a request cancelled before the committer took it was run")
	}
}

// TestBadgerWatchLagged checks that a watcher that stops reading is cut off
// with ErrWatchLagged instead of stalling writers or other watchers.
func TestBadgerWatchLagged(t *testing.T) {
	opts := inMemory(t)
	opts.WatchBuffer = 2
	s := openBadger(t, "", opts)
	slow, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	healthy, err := s.Watch(t.Context(), []byte("k/"))
	if err != nil {
		t.Fatal(err)
	}
	const updates = 5
	// Each Update runs on another goroutine: if publishing blocked on the
	// slow watcher, it would never return, and the test must say so rather
	// than hang. The next Update waits for the healthy watcher to take the
	// batch before, so that only the slow one can fall behind (with a
	// buffer of 2, a healthy reader a scheduling delay late would too).
	deadline := time.After(waitTimeout)
	for i := range updates {
		done := make(chan error, 1)
		go func() {
			done <- s.Update(context.Background(), func(tx store.Txn) error {
				return tx.Put(fmt.Appendf(nil, "k/%d", i), []byte("v"))
			})
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("Updates blocked behind a slow watcher")
		}
		select {
		case <-healthy.Events():
		case <-deadline:
			t.Fatal("healthy watcher starved: the committer is blocked")
		}
	}
	delivered := 0
	for range slow.Events() {
		delivered++
	}
	if delivered != opts.WatchBuffer {
		t.Fatalf("lagging watcher got %d batches, want its buffer of %d", delivered, opts.WatchBuffer)
	}
	if !errors.Is(slow.Err(), store.ErrWatchLagged) {
		t.Fatalf("lagging watcher ended with %v, want ErrWatchLagged", slow.Err())
	}
	if healthy.Err() != nil {
		t.Fatalf("healthy watcher ended: %v", healthy.Err())
	}
}

// --- helpers ------------------------------------------------------------------

func inMemory(t *testing.T) badgerstore.BadgerOptions {
	opts := testOptions(t)
	opts.InMemory = true
	return opts
}

// holdCommitter occupies the committer with an Update that waits for
// release, so that the test can line Updates up behind it. release returns
// once that Update has completed. It writes nothing, so its batch counts
// in neither BadgerStats.Batches nor Transactions, only in Updates.
func holdCommitter(t *testing.T, s *badgerstore.Badger) (release func()) {
	t.Helper()
	entered, gate, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), func(store.Txn) error {
			close(entered)
			<-gate
			return nil
		})
	}()
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("the committer did not start the holding Update")
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		close(gate)
		if err := <-done; err != nil {
			t.Errorf("holding Update: %v", err)
		}
	}
	t.Cleanup(release)
	return release
}

// startUpdates starts n Updates one at a time, each queued before the next
// starts so that their commit order is their index order.
func startUpdates(t *testing.T, s *badgerstore.Badger, n int, fn func(i int) func(store.Txn) error) []chan error {
	t.Helper()
	results := make([]chan error, n)
	base := s.Stats().Queued
	for i := range n {
		results[i] = make(chan error, 1)
		go func() { results[i] <- s.Update(context.Background(), fn(i)) }()
		waitQueued(t, s, base+i+1)
	}
	return results
}

func collectResults(t *testing.T, results []chan error) []error {
	t.Helper()
	errs := make([]error, len(results))
	for i, ch := range results {
		select {
		case errs[i] = <-ch:
		case <-time.After(waitTimeout):
			t.Fatalf("Update %d did not return", i)
		}
	}
	return errs
}

// waitQueued waits until n Updates wait for the committer. Stats offers no
// notification, so this polls, bounded by a deadline.
func waitQueued(t *testing.T, s *badgerstore.Badger, n int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for s.Stats().Queued < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d Updates queued, want %d", s.Stats().Queued, n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func put(t *testing.T, s store.Store, key, value string) {
	t.Helper()
	if err := s.Update(t.Context(), func(tx store.Txn) error {
		return tx.Put([]byte(key), []byte(value))
	}); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func lookup(t *testing.T, s store.Store, key string) (string, bool) {
	t.Helper()
	var value []byte
	err := s.View(t.Context(), func(tx store.ReadTxn) error {
		var err error
		value, err = tx.Get([]byte(key))
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return "", false
	}
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(value), true
}

func get(t *testing.T, s store.Store, key string) string {
	t.Helper()
	v, ok := lookup(t, s, key)
	if !ok {
		t.Fatalf("%s is missing", key)
	}
	return v
}

func revision(t *testing.T, s store.Store) uint64 {
	t.Helper()
	var rev uint64
	if err := s.View(t.Context(), func(tx store.ReadTxn) error {
		rev = tx.Revision()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rev
}

// A process killed between Badger creating a memtable log and sizing it
// leaves a zero-byte .mem file; the store must still open, with every
// acknowledged write, and keep working.
func TestOpenAfterACrashLeftAnEmptyMemtableLog(t *testing.T) {
	dir := t.TempDir()
	s, err := badgerstore.OpenBadger(dir, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put([]byte("k/acked"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// What a kill -9 right after Badger's create leaves behind.
	if err := os.WriteFile(dir+"/00099.mem", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openBadger(t, dir, testOptions(t))
	if err := s.Update(t.Context(), func(tx store.Txn) error { return tx.Put([]byte("k/after"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k/acked", "k/after"} {
		if err := s.View(t.Context(), func(tx store.ReadTxn) error { _, err := tx.Get([]byte(k)); return err }); err != nil {
			t.Fatalf("%s after reopen: %v", k, err)
		}
	}
}

// TestWatchVisibleKnowsEveryChangeAReaderCanSee: the committer is held
// between a write's commit and the publication of its events — a reader
// can see the write, the watch has not had it — and the WatchVisible
// consumer is told so (unseen); once the Update returned, its events are
// in the buffer and nothing is unseen. Writes under another prefix are
// neither delivered nor unseen. A watch established in that gap is told
// so too.
func TestWatchVisibleKnowsEveryChangeAReaderCanSee(t *testing.T) {
	committed, release, failed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	reset := badgerstore.SetAfterCommit(func() {
		select {
		case committed <- struct{}{}:
			select {
			case <-release:
			case <-failed:
			}
		case <-failed:
		}
	})
	t.Cleanup(reset) // after the store's close: cleanups run last first
	s := openBadger(t, t.TempDir(), testOptions(t))
	t.Cleanup(func() { close(failed) }) // lets the committer go if the test stopped holding it
	ctx := context.Background()
	w, unseen, err := s.WatchVisible(ctx, []byte("node/"))
	if err != nil {
		t.Fatal(err)
	}
	buffered := func() bool {
		select {
		case batch, ok := <-w.Events():
			if !ok {
				t.Fatalf("the watch ended: %v", w.Err())
			}
			if len(batch) != 1 || !bytes.HasPrefix(batch[0].Key, []byte("node/")) {
				t.Fatalf("unexpected events %v", batch)
			}
			return true
		default:
			return false
		}
	}
	var late store.Watcher
	var lateUnseen func() bool
	write := func(key string) {
		done := make(chan error, 1)
		go func() {
			done <- s.Update(ctx, func(tx store.Txn) error { return tx.Put([]byte(key), []byte("v")) })
		}()
		<-committed
		if key == "node/late" {
			// A watch established now was not there when the batch was
			// marked: it too is told a change may be unseen.
			if late, lateUnseen, err = s.WatchVisible(ctx, []byte("node/")); err != nil {
				t.Fatal(err)
			}
			if !lateUnseen() {
				t.Fatal("a watch established while a commit was visible and unpublished is not told so")
			}
		}
		if err := s.View(ctx, func(tx store.ReadTxn) error {
			_, err := tx.Get([]byte(key))
			return err
		}); err != nil {
			t.Fatalf("%s committed but not visible: %v", key, err)
		}
		u, b := unseen(), buffered()
		release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		under := strings.HasPrefix(key, "node/")
		if b || u != under {
			t.Fatalf("%s visible to a reader, not yet published: buffered %v, unseen %v; want unseen %v", key, b, u, under)
		}
		if buffered() != under || unseen() {
			t.Fatalf("%s answered: want its events buffered (%v) and nothing unseen", key, under)
		}
	}
	write("node/1")
	write("lease/1")
	write("node/2")
	write("node/late")
	if lateUnseen() {
		t.Fatal("the late watch still says unseen once the commit settled")
	}
	select {
	case batch := <-late.Events():
		if len(batch) != 1 || string(batch[0].Key) != "node/late" {
			t.Fatalf("the late watch got %v", batch)
		}
	default:
		t.Fatal("the late watch did not get the write it was told of")
	}
}

// TestBadgerUpdatesReadTheLatestCommittedValue reads keys inside Updates
// (the committer's reads, which its memory of recent values answers) as
// they change from small to larger than that memory keeps, to absent and
// back, and after enough other writes to turn the memory over: every read
// sees the value of the last acknowledged Update, and the store reopened
// agrees.
func TestBadgerUpdatesReadTheLatestCommittedValue(t *testing.T) {
	dir := t.TempDir()
	s := openBadger(t, dir, testOptions(t))
	ctx := context.Background()
	key := []byte("k/changing")
	readIn := func(s *badgerstore.Badger, k []byte) (v []byte, found bool) {
		t.Helper()
		if err := s.Update(ctx, func(tx store.Txn) error {
			got, err := tx.Get(k)
			switch {
			case errors.Is(err, store.ErrNotFound):
				return nil
			case err != nil:
				return err
			}
			v, found = got, true
			return nil
		}); err != nil {
			t.Fatalf("Update reading %s: %v", k, err)
		}
		return v, found
	}
	put := func(k, v []byte) {
		t.Helper()
		if err := s.Update(ctx, func(tx store.Txn) error { return tx.Put(k, v) }); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
	}
	large := bytes.Repeat([]byte{'L'}, 64<<10)
	steps := []struct {
		value  []byte
		delete bool
	}{
		{value: []byte("small 1")},
		{value: large},
		{value: []byte("small 2")},
		{delete: true},
		{value: []byte{}},
		{value: append([]byte("large again "), large...)},
		{value: []byte("small 3")},
	}
	for i, step := range steps {
		if _, found := readIn(s, key); found != (i > 0 && !steps[i-1].delete) {
			t.Fatalf("step %d: before the write, found %v", i, found)
		}
		if step.delete {
			if err := s.Update(ctx, func(tx store.Txn) error { return tx.Delete(key) }); err != nil {
				t.Fatal(err)
			}
		} else {
			put(key, step.value)
		}
		for range 2 { // a read that misses the memory, then one that may hit it
			v, found := readIn(s, key)
			if found == step.delete || !bytes.Equal(v, step.value) {
				t.Fatalf("step %d: an Update read %d bytes (found %v), want the %d just written (deleted %v)", i, len(v), found, len(step.value), step.delete)
			}
		}
	}
	// Many keys, each read back after as many others were written, and
	// each rewritten from what an Update read of it: a counter per key.
	const keys = 6000
	for round := range 3 {
		for i := range keys {
			k := fmt.Appendf(nil, "k/counter/%05d", i)
			if err := s.Update(ctx, func(tx store.Txn) error {
				n := 0
				v, err := tx.Get(k)
				switch {
				case errors.Is(err, store.ErrNotFound):
				case err != nil:
					return err
				default:
					if n, err = strconv.Atoi(string(v)); err != nil {
						return err
					}
				}
				if n != round {
					return fmt.Errorf("%s read %d in round %d", k, n, round)
				}
				return tx.Put(k, []byte(strconv.Itoa(n+1)))
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	closeWithin(t, s)
	s = openBadger(t, dir, testOptions(t))
	if v, _ := readIn(s, key); !bytes.Equal(v, []byte("small 3")) {
		t.Fatalf("reopened: %s is %q, want %q", key, v, "small 3")
	}
	if v, _ := readIn(s, []byte("k/counter/00000")); string(v) != "3" {
		t.Fatalf("reopened: the first counter is %q, want 3", v)
	}
}
