package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// RecordSink receives each reconciliation record once it is persisted.
// Delivery is at least once: a sink must accept the same record twice.
type RecordSink interface {
	Deliver(ctx context.Context, rec *tetherv1.ReconciliationRecord) error
}

// MarshalRecord renders a record as the JSON published by
// docs/record.schema.json (protobuf JSON names, lowerCamelCase).
func MarshalRecord(rec *tetherv1.ReconciliationRecord) ([]byte, error) {
	return protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(rec)
}

// DirSink writes <dir>/<record id>.json atomically.
type DirSink struct{ Dir string }

// Deliver writes the record file (rename makes it appear whole).
func (d DirSink) Deliver(_ context.Context, rec *tetherv1.ReconciliationRecord) error {
	b, err := MarshalRecord(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.Dir, 0o750); err != nil {
		return err
	}
	final := filepath.Join(d.Dir, rec.RecordId+".json")
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
func (w WebhookSink) Deliver(ctx context.Context, rec *tetherv1.ReconciliationRecord) error {
	b, err := MarshalRecord(rec)
	if err != nil {
		return err
	}
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
func (m MultiSink) Deliver(ctx context.Context, rec *tetherv1.ReconciliationRecord) error {
	for _, s := range m {
		if err := s.Deliver(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}

// Outbox delivers persisted records to the sink until each is delivered:
// the record is written to the store with an outbox entry in the same
// transaction, and the entry is removed only after the sink accepted it. A
// sink that is down delays delivery; it never loses a record.
type Outbox struct {
	Supervisor *Supervisor
	// Retry is the wait after a failed delivery (default 2s, doubling to 1m).
	Retry time.Duration
	// Wait is how the outbox waits between retries; tests substitute it.
	Wait func(ctx context.Context, d time.Duration) error
}

// Run delivers until ctx ends.
func (o *Outbox) Run(ctx context.Context) error {
	s := o.Supervisor
	if s.Sink == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	wait := o.Wait
	if wait == nil {
		wait = func(ctx context.Context, d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
				return nil
			}
		}
	}
	w, err := s.Store.Watch(ctx, []byte(prefixOutbox))
	if err != nil {
		return err
	}
	backoff := o.Retry
	if backoff <= 0 {
		backoff = 2 * time.Second
	}
	delay := backoff
	for {
		pending, err := o.pending(ctx)
		if err != nil {
			return err
		}
		failed := false
		for _, rid := range pending {
			if err := o.deliver(ctx, rid); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.Log.Warn("record delivery failed; will retry", "record_id", rid, "error", err)
				failed = true
				break
			}
		}
		if failed {
			if err := wait(ctx, delay); err != nil {
				return err
			}
			delay = min(delay*2, time.Minute)
			continue
		}
		delay = backoff
		select {
		case <-ctx.Done():
			return ctx.Err()
		case _, ok := <-w.Events():
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return w.Err()
			}
		}
	}
}

func (o *Outbox) pending(ctx context.Context) ([]string, error) {
	var out []string
	err := o.Supervisor.Store.View(ctx, func(tx store.ReadTxn) error {
		out = nil
		return tx.Scan([]byte(prefixOutbox), nil, func(k, _ []byte) error {
			out = append(out, strings.TrimPrefix(string(k), prefixOutbox))
			return nil
		})
	})
	return out, err
}

func (o *Outbox) deliver(ctx context.Context, recordID string) error {
	s := o.Supervisor
	rec, err := s.Record(ctx, recordID, "")
	if err != nil {
		return err
	}
	if err := s.Sink.Deliver(ctx, rec); err != nil {
		return err
	}
	return s.Store.Update(ctx, func(tx store.Txn) error { return tx.Delete(outboxKey(recordID)) })
}
