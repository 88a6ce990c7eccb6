package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Throughput runs op in a loop on each of workers goroutines and returns
// the completed operations per second over d. The first part of the run
// (a tenth of d, at most a second) is a warm-up that is not counted, so
// starting a thousand goroutines and filling caches does not skew the rate.
//
// op receives a context that ends when the measurement does; errors that
// follow from that are ignored. Any other error stops the run and is
// returned.
func Throughput(ctx context.Context, workers int, d time.Duration, op func(ctx context.Context, worker int) error) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	warmup := min(d/10, time.Second)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	var (
		completed atomic.Int64
		firstErr  error
		errOnce   sync.Once
		wg        sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if err := op(runCtx, w); err != nil {
					if runCtx.Err() == nil {
						errOnce.Do(func() { firstErr = fmt.Errorf("worker %d: %w", w, err) })
						stop()
					}
					return
				}
				completed.Add(1)
			}
		})
	}

	// sleep waits for d or the end of the run, whichever comes first.
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-runCtx.Done():
			return false
		}
	}
	var rate float64
	measured := false
	if sleep(warmup) {
		startCount, start := completed.Load(), time.Now()
		if sleep(d) {
			rate = float64(completed.Load()-startCount) / time.Since(start).Seconds()
			measured = true
		}
	}
	stop()
	wg.Wait()
	switch {
	case firstErr != nil:
		return 0, firstErr
	case !measured:
		return 0, ctx.Err()
	}
	return rate, nil
}
