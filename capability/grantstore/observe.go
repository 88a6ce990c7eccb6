package grantstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// publishSpanName is the span of one tombstone reaching this replica's
// revocation feed, in the trace of the request that revoked it.
const publishSpanName = "revocation.publish"

// published runs for each tombstone the feed took from a live store event,
// and for each a rescan found past what the feed had published (its watch
// fell behind; no trace to join then): a span in the revoking request's
// trace when that request was traced in this process, and Config.OnPublish.
func (s *Service) published(ctx context.Context, t capability.Tombstone, cause trace.SpanContext) {
	if cause.IsSampled() {
		parent := trace.ContextWithRemoteSpanContext(ctx, cause)
		_, span := otel.Tracer("github.com/tetherhq/tether/capability/grantstore").Start(parent, publishSpanName,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(trace.Link{SpanContext: cause}),
			trace.WithAttributes(
				attribute.Int64("tether.revocation.sequence", int64(t.Sequence)),
				attribute.String("tether.grant.id", t.GrantID)))
		span.End()
	}
	if s.cfg.OnPublish != nil {
		s.cfg.OnPublish(t)
	}
}

// FeedPosition is how far this replica's revocation feed has got.
type FeedPosition struct {
	// Served is the last sequence the feed serves to followers; Stored the
	// last sequence committed. Stored - Served tombstones are committed but
	// not yet published here.
	Served, Stored uint64
	// OldestUnserved is when the first of those was revoked (zero when
	// none is waiting).
	OldestUnserved time.Time
}

// FeedPosition compares the feed this replica serves with the stored feed:
// one or two key reads, so it may be called on every metrics scrape.
func (s *Service) FeedPosition(ctx context.Context) (FeedPosition, error) {
	s.feed.mu.Lock()
	served := s.feed.head
	s.feed.mu.Unlock()
	pos := FeedPosition{Served: served}
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		stored, err := getCounter(tx, feedHeadKey)
		if err != nil {
			return err
		}
		pos.Stored = max(stored, served)
		if pos.Stored == served {
			return nil
		}
		raw, err := tx.Get(tombstoneKey(served + 1))
		if errors.Is(err, store.ErrNotFound) {
			return nil // pruned already
		}
		if err != nil {
			return err
		}
		t, err := decodeTombstone(raw)
		if err != nil {
			return err
		}
		pos.OldestUnserved = t.RevokedAt
		return nil
	})
	if err != nil {
		return FeedPosition{}, fmt.Errorf("grantstore: feed position: %w", err)
	}
	return pos, nil
}
