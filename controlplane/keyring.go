package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// keyRingKey holds the signing keys. The data directory must be protected
// like a private key (the server creates it 0700).
var keyRingKey = []byte("keys/ring")

// keyRing caches the ring read from the store; the store stays the source
// of truth (rotation writes it and then swaps the cache).
type keyRing struct {
	current atomic.Pointer[capability.KeyRing]
}

func (k *keyRing) Get() capability.KeyRing { return *k.current.Load() }

// loadOrCreateKeyRing reads the ring, creating its first key on first start.
func loadOrCreateKeyRing(ctx context.Context, st store.Store, now time.Time) (*keyRing, bool, error) {
	var ring capability.KeyRing
	created := false
	err := st.Update(ctx, func(tx store.Txn) error {
		ring, created = capability.KeyRing{}, false
		v, err := tx.Get(keyRingKey)
		if err == nil {
			return json.Unmarshal(v, &ring)
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		key, err := capability.NewSigningKey(nil, now, now)
		if err != nil {
			return err
		}
		ring = capability.KeyRing{Keys: []capability.SigningKey{key}}
		created = true
		v, err = json.Marshal(ring)
		if err != nil {
			return err
		}
		return tx.Put(keyRingKey, v)
	})
	if err != nil {
		return nil, false, fmt.Errorf("controlplane: key ring: %w", err)
	}
	k := &keyRing{}
	k.current.Store(&ring)
	return k, created, nil
}
