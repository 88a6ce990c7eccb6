package controlplane

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/store"
)

// healthzFresh is how long /healthz answers with its last read of the
// store. The probe answers without a credential and is not budgeted (an
// orchestrator's probe must not be locked out by a rogue on its address),
// so each probe reading the store (on etcd a request to the cluster) let
// anyone make the server read it as fast as they sent.
const healthzFresh = time.Second

// healthzTimeout bounds the probe's read of the store.
const healthzTimeout = 2 * time.Second

// healthProbe shares one read of the store among the probes of a second:
// one read at a time, and its answer for healthzFresh on the server's
// clock.
type healthProbe struct {
	mu       sync.Mutex
	at       time.Time // when the last answer's read began
	err      error
	answered bool
	reading  chan struct{} // closed when the read in flight ends; nil: none
}

// check returns the store's answer as of at most healthzFresh before now:
// the last read's, the one in flight's, or a new read's.
func (h *healthProbe) check(ctx context.Context, now time.Time, read func(context.Context) error) error {
	h.mu.Lock()
	for {
		if h.answered && !now.Before(h.at) && now.Sub(h.at) < healthzFresh {
			err := h.err
			h.mu.Unlock()
			return err
		}
		if h.reading == nil {
			break
		}
		reading := h.reading
		h.mu.Unlock()
		select {
		case <-reading:
		case <-ctx.Done():
			return ctx.Err()
		}
		h.mu.Lock()
	}
	reading := make(chan struct{})
	h.reading = reading
	h.mu.Unlock()
	// The read answers every probe that waits on it: it does not end with
	// the probe that began it (a rogue hanging up at once must not have
	// the others told the store failed).
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthzTimeout)
	err := read(readCtx)
	cancel()
	h.mu.Lock()
	h.at, h.err, h.answered, h.reading = now, err, true, nil
	h.mu.Unlock()
	close(reading)
	return err
}

// healthz answers 200 when the store answers a read (healthProbe: at most
// one read a second).
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthzTimeout)
	defer cancel()
	err := s.health.check(ctx, s.cfg.Clock.Now(), func(ctx context.Context) error {
		// Reading the revision makes every backend answer (etcd's reads
		// are lazy: a View that reads nothing never reaches the cluster).
		return s.store.View(ctx, func(tx store.ReadTxn) error { tx.Revision(); return nil })
	})
	if err != nil {
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("ok\n"))
}
