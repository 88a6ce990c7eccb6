package controlplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestAProbeThatHangsUpDoesNotFailTheOthers: the probes of /healthz share
// one read of the store; the probe that began it hanging up (a rogue
// connecting, asking and closing at once) must not cancel it, or every
// probe waiting on it — an orchestrator's among them — would be told the
// store failed, and told so for the next second. (Fails if the read's
// context ends with the probe's, or a second probe reads again.)
func TestAProbeThatHangsUpDoesNotFailTheOthers(t *testing.T) {
	var h healthProbe
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	started, release := make(chan struct{}), make(chan struct{})
	var reads atomic.Int32
	var readErr atomic.Value
	read := func(ctx context.Context) error {
		if reads.Add(1) == 1 {
			close(started)
		}
		<-release
		if err := ctx.Err(); err != nil {
			readErr.Store(err)
			return err
		}
		return nil
	}
	rogueCtx, hangUp := context.WithCancel(context.Background())
	rogue := make(chan error, 1)
	go func() { rogue <- h.check(rogueCtx, now, read) }()
	<-started
	hangUp()
	other := make(chan error, 1)
	go func() { other <- h.check(context.Background(), now.Add(100*time.Millisecond), read) }()
	close(release)
	if err := <-rogue; err != nil {
		t.Errorf("the probe that hung up: %v, want the store's answer", err)
	}
	if err := <-other; err != nil {
		t.Errorf("the probe waiting on the read: %v, want the store's answer", err)
	}
	if err, _ := readErr.Load().(error); err != nil {
		t.Errorf("the shared read's context ended with the probe that began it: %v", err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("two probes within a second read the store %d times, want once", n)
	}
}
