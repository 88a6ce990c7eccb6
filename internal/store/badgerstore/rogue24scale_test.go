package badgerstore_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
)

// goroutineID is the running goroutine's number, from the first line of
// its stack ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

// A lone Update (nobody committing) is committed on its caller's
// goroutine: no hand-off to the committer's goroutine and back, two
// goroutine wake-ups fewer per lone commit (issue 21, the lone renew).
func TestRogue24ScaleALoneUpdateCommitsOnItsCallersGoroutine(t *testing.T) {
	s := openBadger(t, t.TempDir(), testOptions(t))
	ctx := context.Background()
	for i := range 3 {
		caller, ranOn := goroutineID(), ""
		if err := s.Update(ctx, func(tx store.Txn) error {
			ranOn = goroutineID()
			return tx.Put([]byte("rogue24scale/lone"), []byte{byte(i)})
		}); err != nil {
			t.Fatalf("Update %d: %v", i, err)
		}
		if ranOn != caller {
			t.Fatalf("Update %d: its function ran on goroutine %s, its caller is %s: a lone Update still hands off to the committer", i, ranOn, caller)
		}
	}
}

// A caller that gives up (its context ends) while its own Update leads
// the group commit on its goroutine can neither lose its write nor the
// writes queued behind it: its function had started, so its Update waits
// for the commit and reports it, and the Update queued meanwhile is
// committed (by the committer's goroutine once the leader is done) and
// answered. A rogue disconnecting mid-call cannot drop another's write.
func TestRogue24ScaleALeaderThatGivesUpStillCommitsAndLetsTheQueueThrough(t *testing.T) {
	s := openBadger(t, t.TempDir(), testOptions(t))
	leaderCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, release := make(chan struct{}), make(chan struct{})
	leaderDone := make(chan error, 1)
	go func() {
		leaderDone <- s.Update(leaderCtx, func(tx store.Txn) error {
			close(started)
			<-release
			return tx.Put([]byte("rogue24scale/leader"), []byte("leader"))
		})
	}()
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("the leader's function did not start")
	}
	// Queued while the leader commits: the committer's goroutine takes it.
	var wg sync.WaitGroup
	followerDone := make(chan error, 1)
	wg.Go(func() {
		followerDone <- s.Update(context.Background(), func(tx store.Txn) error {
			return tx.Put([]byte("rogue24scale/follower"), []byte("follower"))
		})
	})
	waitQueued(t, s, 1)
	cancel() // the leader's caller gives up mid-commit
	close(release)
	for name, done := range map[string]chan error{"leader": leaderDone, "follower": followerDone} {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s's Update: %v, want nil (its function had started, so it waits for the commit)", name, err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("%s's Update did not return within %v", name, waitTimeout)
		}
	}
	wg.Wait()
	for key, want := range map[string]string{"rogue24scale/leader": "leader", "rogue24scale/follower": "follower"} {
		if err := s.View(context.Background(), func(tx store.ReadTxn) error {
			got, err := tx.Get([]byte(key))
			if err != nil {
				return err
			}
			if !bytes.Equal(got, []byte(want)) {
				t.Errorf("%s = %q, want %q", key, got, want)
			}
			return nil
		}); err != nil {
			t.Fatalf("View %s: %v", key, err)
		}
	}
}

// An Update whose context ended before it was pushed never runs, leads
// nothing and writes nothing, as before.
func TestRogue24ScaleAnUpdateWithAnEndedContextNeverRuns(t *testing.T) {
	s := openBadger(t, t.TempDir(), testOptions(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := s.Update(ctx, func(tx store.Txn) error {
		ran = true
		return tx.Put([]byte("rogue24scale/late"), []byte("x"))
	})
	if !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Update with an ended context: err %v, ran %v; want context.Canceled and not run", err, ran)
	}
	if err := s.View(context.Background(), func(tx store.ReadTxn) error {
		_, err := tx.Get([]byte("rogue24scale/late"))
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get of the key the ended Update would have written: %v, want ErrNotFound", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
