package controlplane_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// flakyWebhook is a record webhook that refuses the first failures
// attempts (503) and accepts the rest, counting both by record id.
type flakyWebhook struct {
	*httptest.Server
	mu        sync.Mutex
	failures  int
	attempts  map[string]int
	delivered map[string]int
	seen      chan string // each attempt's record id
}

func newFlakyWebhook(t *testing.T, failures int) *flakyWebhook {
	h := &flakyWebhook{failures: failures, attempts: map[string]int{}, delivered: map[string]int{}, seen: make(chan string, 64)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var rec struct {
			RecordID string `json:"recordId"`
		}
		if err := json.Unmarshal(body, &rec); err != nil || rec.RecordID == "" {
			http.Error(w, "bad record", http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.attempts[rec.RecordID]++
		refuse := h.failures > 0
		if refuse {
			h.failures--
		} else {
			h.delivered[rec.RecordID]++
		}
		h.mu.Unlock()
		defer func() { h.seen <- rec.RecordID }()
		if refuse {
			http.Error(w, "sink down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *flakyWebhook) counts(id string) (attempts, delivered int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempts[id], h.delivered[id]
}

// next waits for the next delivery attempt.
func (h *flakyWebhook) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case id := <-h.seen:
		return id
	case <-time.After(20 * time.Second): // a guard, not a synchronisation
		t.Fatalf("no delivery attempt: %s", what)
		return ""
	}
}

// TestRecordWebhookFailingThenSucceedingDeliversOnce: the webhook refuses a
// record three times. The outbox retries it with a doubling backoff on the
// control plane's clock (nothing happens until the manual clock passes
// each wait), the server keeps serving meanwhile, and once the webhook
// accepts, the record has been delivered exactly once.
func TestRecordWebhookFailingThenSucceedingDeliversOnce(t *testing.T) {
	const failures = 3
	hook := newFlakyWebhook(t, failures)
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RecordWebhook = hook.URL })
	admin := srv.AdminClients()
	node := register(t, admin, "short-lived")
	term := terminate(t, admin, node.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, done.TerminationId)

	backoff := supervisor.DefaultRecordRetry
	for i := range failures {
		if id := hook.next(t, "the outbox to try the record"); id != rec.RecordId {
			t.Fatalf("attempt %d carried record %s, want %s", i+1, id, rec.RecordId)
		}
		// The outbox arms its retry for the backoff on the clock (which
		// has not moved since the attempt).
		retryAt := clk.Now().Add(backoff)
		testserver.WaitFor(t, 20*time.Second, "the outbox to arm its retry", func() bool { return clk.Armed(retryAt) })
		clk.Advance(backoff - time.Millisecond)
		// The server serves while its sink fails: a new agent registers
		// and the record reads back.
		register(t, admin, "meanwhile")
		if again := record(t, admin, done.TerminationId); again.RecordId != rec.RecordId {
			t.Fatalf("the record read back as %s, want %s", again.RecordId, rec.RecordId)
		}
		// Short of its backoff there was no retry.
		select {
		case id := <-hook.seen:
			t.Fatalf("record %s retried before its %s backoff", id, backoff)
		default:
		}
		clk.Advance(time.Millisecond)
		backoff *= 2
	}
	if id := hook.next(t, "the retry that succeeds"); id != rec.RecordId {
		t.Fatalf("the last attempt carried record %s, want %s", id, rec.RecordId)
	}
	// Later waits pass with nothing left to retry; another record, written
	// after them, is the next the webhook sees.
	clk.Advance(time.Hour)
	other := register(t, admin, "second")
	second := waitState(t, srv, terminate(t, admin, other.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0).TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	secondRec := record(t, admin, second.TerminationId)
	if id := hook.next(t, "the second record"); id != secondRec.RecordId {
		t.Fatalf("after the first record was delivered the webhook got %s again, want only the second record %s", id, secondRec.RecordId)
	}
	if attempts, delivered := hook.counts(rec.RecordId); attempts != failures+1 || delivered != 1 {
		t.Fatalf("record %s: %d attempts, %d deliveries; want %d and exactly 1", rec.RecordId, attempts, delivered, failures+1)
	}
}

// TestRecordUndeliveredAtARestartIsDelivered: the webhook refuses the record
// and the control plane stops before any retry; restarted on the same data
// directory (the clock has not moved), the outbox finds the undelivered
// record in the store and delivers it once.
func TestRecordUndeliveredAtARestartIsDelivered(t *testing.T) {
	hook := newFlakyWebhook(t, 1)
	clk := clock.NewManual(time.Now().UTC())
	withHook := func(cfg *controlplane.Config) { cfg.RecordWebhook = hook.URL }
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir, testserver.WithClock(clk), withHook)
	admin := srv.AdminClients()
	node := register(t, admin, "short-lived")
	term := terminate(t, admin, node.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, done.TerminationId)
	if id := hook.next(t, "the refused attempt"); id != rec.RecordId {
		t.Fatalf("attempt carried %s, want %s", id, rec.RecordId)
	}
	srv.Stop()

	again := testserver.StartIn(t, dir, testserver.WithClock(clk), withHook)
	if id := hook.next(t, "the restarted outbox to deliver"); id != rec.RecordId {
		t.Fatalf("after the restart the webhook got %s, want %s", id, rec.RecordId)
	}
	if attempts, delivered := hook.counts(rec.RecordId); attempts != 2 || delivered != 1 {
		t.Fatalf("record %s: %d attempts, %d deliveries; want 2 and exactly 1", rec.RecordId, attempts, delivered)
	}
	if got := record(t, again.AdminClients(), done.TerminationId); got.RecordId != rec.RecordId {
		t.Fatalf("after the restart the record is %s, want %s", got.RecordId, rec.RecordId)
	}
}
