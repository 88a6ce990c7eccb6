package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/internal/store"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdKeyspace maps the store's keys into its etcd namespace: caller key k
// is etcd key prefix+k. The store's own keys are prefix+"\x00"+name, below
// every caller key, so scans and watches of callers never reach them.
type etcdKeyspace struct {
	prefix string
	// end is the first etcd key after the namespace.
	end string
}

func newEtcdKeyspace(prefix string) (etcdKeyspace, error) {
	end := prefixEnd([]byte(prefix))
	if end == nil {
		return etcdKeyspace{}, fmt.Errorf("store: etcd prefix %q has no end: use a prefix such as %q", prefix, defaultEtcdPrefix)
	}
	return etcdKeyspace{prefix: prefix, end: string(end)}, nil
}

// key is the etcd key of a caller key.
func (k etcdKeyspace) key(key []byte) string { return k.prefix + string(key) }

// callerKey is the caller's key of an etcd key in the namespace.
func (k etcdKeyspace) callerKey(etcdKey []byte) []byte { return etcdKey[len(k.prefix):] }

// span is the etcd range [from, to) of the caller keys that start with
// prefix and are >= lower (lower from ScanLowerBound). from >= to means
// the range is empty.
func (k etcdKeyspace) span(prefix, lower []byte) etcdSpan {
	sp := etcdSpan{from: k.key(lower), to: k.end}
	if end := prefixEnd(prefix); end != nil {
		sp.to = k.key(end)
	}
	return sp
}

// reserved is the etcd prefix of the store's own keys called name.
func (k etcdKeyspace) reserved(name string) string {
	return k.prefix + string([]byte{store.ReservedKeyByte}) + name
}

// revisionProbe is a key no caller can write: reading it is the cheapest
// way to learn the current revision.
func (k etcdKeyspace) revisionProbe() string { return k.reserved("revision") }

// etcdSpan is the etcd key range [from, to).
type etcdSpan struct{ from, to string }

func (sp etcdSpan) empty() bool { return sp.from >= sp.to }

func (sp etcdSpan) contains(key string) bool { return sp.from <= key && key < sp.to }

// prefixEnd is the first key after every key starting with prefix, or nil
// when there is none (prefix empty or all 0xff).
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// etcdOutcomeUnknown is in the message of commit errors after which etcd
// may or may not have applied the transaction.
const etcdOutcomeUnknown = "the outcome is unknown: the writes may or may not have been applied"

// readError turns the error of a read into the store's terms.
func (s *Etcd) readError(ctx context.Context, err error) error {
	switch {
	case s.lifetime.Err() != nil:
		return fmt.Errorf("%w: a read was abandoned at close: %v", store.ErrClosed, err)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("store: etcd read: %w", err)
}

// commitError turns the error of a commit into the store's terms: the
// size refusals as ErrTooLarge, which etcd reports before applying
// anything; any other error leaves the outcome unknown.
func (s *Etcd) commitError(err error, req commitRequest) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: etcd refused a transaction of %d writes and %d comparisons as too many operations; "+
			"start every etcd member with --max-txn-ops=%d or more (docs/etcd.md) and set EtcdOptions.MaxTxnOps to it",
			store.ErrTooLarge, len(req.ops), len(req.compares), max(len(req.ops), len(req.compares)))
	case errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted:
		return fmt.Errorf("%w: etcd refused a transaction of about %d bytes as too large; "+
			"start every etcd member with --max-request-bytes=%d or more (docs/etcd.md) and set EtcdOptions.MaxRequestBytes to it: %v",
			store.ErrTooLarge, req.bytes, EtcdMaxRequestBytes, err)
	case s.lifetime.Err() != nil:
		return fmt.Errorf("%w: a commit was abandoned at close; %s", store.ErrClosed, etcdOutcomeUnknown)
	}
	return fmt.Errorf("store: etcd commit failed and %s: %w", etcdOutcomeUnknown, err)
}
