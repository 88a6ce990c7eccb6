package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
)

// RecordSink receives each reconciliation record once it is persisted, as
// the published document: doc is the record rendered by the outbox's
// Render (the JSON of docs/record.schema.json). Delivery is at least once:
// a sink must accept the same record twice.
type RecordSink interface {
	Deliver(ctx context.Context, recordID string, doc []byte) error
}

// DirSink writes <dir>/<record id>.json atomically.
type DirSink struct{ Dir string }

// Deliver writes the record file (rename makes it appear whole).
func (d DirSink) Deliver(_ context.Context, recordID string, b []byte) error {
	if err := os.MkdirAll(d.Dir, 0o750); err != nil {
		return err
	}
	final := filepath.Join(d.Dir, recordID+".json")
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

// WebhookSink POSTs the record as JSON to URL; any 2xx is delivery.
type WebhookSink struct {
	URL  string
	HTTP *http.Client
}

// Deliver posts the record.
func (w WebhookSink) Deliver(ctx context.Context, _ string, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := w.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("record webhook unreachable: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("record webhook answered %d", resp.StatusCode)
	}
	return nil
}

// MultiSink delivers to every sink; it fails if any fails (and the outbox
// retries all of them, which is why sinks must be idempotent).
type MultiSink []RecordSink

// Deliver delivers to each sink in turn.
func (m MultiSink) Deliver(ctx context.Context, recordID string, doc []byte) error {
	for _, s := range m {
		if err := s.Deliver(ctx, recordID, doc); err != nil {
			return err
		}
	}
	return nil
}

// Outbox delivers persisted records to the sink until each is delivered:
// the record is written to the store with an outbox entry in the same
// transaction, and the entry is removed only after the sink accepted it. A
// sink that is down delays delivery; it never loses a record, and it never
// stops the server: each record is retried on its own, with a backoff on
// the supervisor's clock, until the sink takes it. Run is a reconcile loop
// (internal/reconcile) keyed by record id, so a restart, a change of
// leader or a lagged watch resumes every undelivered record from the store.
type Outbox struct {
	Supervisor *Supervisor
	// Render turns a record into the document the sink publishes (the
	// caller wires the rendering of docs/record.schema.json); required
	// when the supervisor has a Sink.
	Render func(*ReconciliationRecord) ([]byte, error)
	// Retry is the wait after a failed delivery (default 2s, doubling to
	// MaxRetry, default one minute).
	Retry, MaxRetry time.Duration
}

// Default backoff of a failed delivery.
const (
	DefaultRecordRetry    = 2 * time.Second
	DefaultRecordMaxRetry = time.Minute
)

// Run delivers until ctx ends; it returns only then, with ctx's error
// (or at once when there is a Sink but no Render: a wiring error).
func (o *Outbox) Run(ctx context.Context) error {
	s := o.Supervisor
	if s.Sink == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	if o.Render == nil {
		return errors.New("record outbox: a sink without Render: the outbox cannot render records")
	}
	retry := o.Retry
	if retry <= 0 {
		retry = DefaultRecordRetry
	}
	maxRetry := o.MaxRetry
	if maxRetry <= 0 {
		maxRetry = max(retry, DefaultRecordMaxRetry)
	}
	// groups: record id → its turn, the group its entry names (a
	// termination's tree, its operators' stops a turn of their own); ""
	// for an entry written before the entries named one.
	var groups sync.Map
	note := func(recordID string, group []byte) {
		if len(group) > 0 {
			groups.Store(recordID, string(group))
		}
	}
	return reconcile.New(reconcile.Config{
		Name: "record outbox", Store: s.Store, Clock: s.Clock, Log: s.Log,
		Watch: [][]byte{[]byte(prefixOutbox)},
		Scan: func(ctx context.Context) ([]string, error) {
			groups.Clear()
			return o.pending(ctx, note)
		},
		Changed: func(batch []store.Event, kick func(string)) {
			for _, ev := range batch {
				recordID := strings.TrimPrefix(string(ev.Key), prefixOutbox)
				if ev.Type == store.EventPut {
					note(recordID, ev.Value)
					kick(recordID)
				} else {
					groups.Delete(recordID)
				}
			}
		},
		// The trees take turns, as in the termination reconciler: the
		// records of a rogue's many stops of its own children, due at
		// once (a sink back after an outage), do not hold an operator's
		// record, or another tree's, behind them all.
		Group: func(recordID string) string {
			if g, ok := groups.Load(recordID); ok {
				return g.(string)
			}
			return ""
		},
		Reconcile: func(ctx context.Context, recordID string) (time.Time, error) {
			return time.Time{}, o.deliver(ctx, recordID)
		},
		Retry: retry, MaxRetry: maxRetry,
	}).Run(ctx)
}

// pending lists the undelivered records, and tells note each one's group.
func (o *Outbox) pending(ctx context.Context, note func(recordID string, group []byte)) ([]string, error) {
	var out []string
	err := o.Supervisor.Store.View(ctx, func(tx store.ReadTxn) error {
		out = nil
		return tx.Scan([]byte(prefixOutbox), nil, func(k, v []byte) error {
			recordID := strings.TrimPrefix(string(k), prefixOutbox)
			out = append(out, recordID)
			note(recordID, v)
			return nil
		})
	})
	return out, err
}

// deliver hands one record to the sink and then clears its outbox entry.
// An entry already cleared (delivered before a kick came) is not sent
// again.
func (o *Outbox) deliver(ctx context.Context, recordID string) error {
	s := o.Supervisor
	err := s.Store.View(ctx, func(tx store.ReadTxn) error { _, err := tx.Get(outboxKey(recordID)); return err })
	if errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	rec, err := s.Record(ctx, recordID, "")
	if err != nil {
		return fmt.Errorf("record outbox: read record %s: %w", recordID, err)
	}
	doc, err := o.Render(rec)
	if err != nil {
		return fmt.Errorf("record outbox: render record %s: %w", recordID, err)
	}
	if err := s.Sink.Deliver(ctx, recordID, doc); err != nil {
		return err
	}
	return s.Store.Update(ctx, func(tx store.Txn) error { return tx.Delete(outboxKey(recordID)) })
}
