package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Key rotation: RotateKeys writes the rotated ring to the store in one
// transaction and swaps this replica's cached ring; every replica follows
// the stored ring (followKeyRing), and the leader prunes retired keys
// (pruneKeyRing) once the last token they could have signed has expired.

// Key rotation bounds.
const (
	DefaultKeyPublishAhead = 5 * time.Minute
	MaxKeyPublishAhead     = 24 * time.Hour
)

// maxTokenTTL is the longest life of any token the ring signs: operator
// tokens (the bootstrap admin token included), agent credentials and
// capability tokens. A retired key stays in JWKS that long after its
// successor starts signing.
func (s *Server) maxTokenTTL() time.Duration {
	return max(s.cfg.AgentCredentialTTL, s.cfg.AdminTokenTTL, MaxOperatorTokenTTL, s.cfg.CapabilityTokenTTL, capability.MaxTokenTTL)
}

// RotateKeys adds a signing key (see auth.proto).
func (a *authService) RotateKeys(ctx context.Context, req *connect.Request[tetherv1.RotateKeysRequest]) (*connect.Response[tetherv1.RotateKeysResponse], error) {
	ahead := DefaultKeyPublishAhead
	if req.Msg.PublishAhead != nil {
		ahead = req.Msg.PublishAhead.AsDuration()
	}
	if ahead < 0 || ahead > MaxKeyPublishAhead {
		return nil, invalid("publish_ahead must be between 0 and %s", MaxKeyPublishAhead)
	}
	ring, key, err := a.s.rotateKeys(ctx, ahead)
	if err != nil {
		return nil, toConnect(err)
	}
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	a.s.log.Info("signing keys rotated", "by", p.ID(), "kid", key.ID, "active_from", key.ActiveFrom, "keys", len(ring.Keys))
	now := a.s.cfg.Clock.Now()
	return connect.NewResponse(&tetherv1.RotateKeysResponse{Key: keyInfo(ring, key, now), Keys: keyInfos(ring, now)}), nil
}

// ListKeys lists the ring's keys, public halves only.
func (a *authService) ListKeys(ctx context.Context, _ *connect.Request[tetherv1.ListKeysRequest]) (*connect.Response[tetherv1.ListKeysResponse], error) {
	return connect.NewResponse(&tetherv1.ListKeysResponse{Keys: keyInfos(a.s.keys.Get(), a.s.cfg.Clock.Now())}), nil
}

// rotateKeys rotates the stored ring in one transaction (dropping keys
// already past retirement) and swaps the cache once it is durable.
func (s *Server) rotateKeys(ctx context.Context, publishAhead time.Duration) (capability.KeyRing, capability.SigningKey, error) {
	var ring capability.KeyRing
	var key capability.SigningKey
	err := s.store.Update(ctx, func(tx store.Txn) error {
		current, err := readKeyRing(tx)
		if err != nil {
			return err
		}
		now := s.cfg.Clock.Now()
		ring, key, err = current.Prune(now).Rotate(nil, now, publishAhead, s.maxTokenTTL())
		if err != nil {
			return err
		}
		return writeKeyRing(tx, ring)
	})
	if err != nil {
		return capability.KeyRing{}, capability.SigningKey{}, fmt.Errorf("controlplane: rotate keys: %w", err)
	}
	s.keys.set(ring)
	return ring, key, nil
}

func readKeyRing(tx store.ReadTxn) (capability.KeyRing, error) {
	var ring capability.KeyRing
	v, err := tx.Get(keyRingKey)
	if err != nil {
		return ring, err
	}
	return ring, json.Unmarshal(v, &ring)
}

func writeKeyRing(tx store.Txn, ring capability.KeyRing) error {
	v, err := json.Marshal(ring)
	if err != nil {
		return err
	}
	return tx.Put(keyRingKey, v)
}

// set swaps the cached ring.
func (k *keyRing) set(ring capability.KeyRing) { k.current.Store(&ring) }

// followKeyRing keeps this replica's cached ring equal to the stored one,
// so a rotation or a prune made by any replica reaches every verifier and
// signer here. Runs on every replica; a watch that falls behind or fails
// costs a re-read (reconcile.Passes).
func (s *Server) followKeyRing(ctx context.Context) error {
	return reconcile.Passes(ctx, "key ring", s.cfg.Clock, s.log, s.followKeyRingOnce)
}

func (s *Server) followKeyRingOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.store.Watch(ctx, keyRingKey)
	if err != nil {
		return err
	}
	// Re-read after establishing the watch: nothing committed in between
	// is missed.
	ring, err := store.Read(ctx, s.store, readKeyRing)
	if err != nil {
		return err
	}
	s.keys.set(ring)
	for batch := range w.Events() {
		for _, ev := range batch {
			if ev.Type != store.EventPut || !bytes.Equal(ev.Key, keyRingKey) {
				continue
			}
			var next capability.KeyRing
			if err := json.Unmarshal(ev.Value, &next); err != nil {
				return fmt.Errorf("controlplane: stored key ring: %w", err)
			}
			s.keys.set(next)
		}
	}
	return reconcile.WatchEnded(w)
}

// pruneKeyRing drops retired keys from the stored ring when the last token
// they could have signed has expired (on the server's clock). One replica
// (the leader) runs it: a reconcile loop of one key, woken by the ring's
// changes and at the next retirement.
func (s *Server) pruneKeyRing(ctx context.Context) error {
	const ringKey = "ring"
	return reconcile.New(reconcile.Config{
		Name: "key pruner", Store: s.store, Clock: s.cfg.Clock, Log: s.log,
		Watch:   [][]byte{keyRingKey},
		Scan:    func(context.Context) ([]string, error) { return []string{ringKey}, nil },
		Changed: func(_ []store.Event, kick func(string)) { kick(ringKey) },
		Reconcile: func(ctx context.Context, _ string) (time.Time, error) {
			ring, _, err := s.pruneKeys(ctx)
			if err != nil {
				return time.Time{}, err
			}
			// Look again at the next retirement, and a minute later at
			// most: a wall clock that jumps is noticed then.
			now := s.cfg.Clock.Now()
			wake := now.Add(time.Minute)
			if next := nextRetirement(ring); next.After(now) && next.Before(wake) {
				wake = next
			}
			return wake, nil
		},
	}).Run(ctx)
}

// PruneKeys drops every key whose tokens have all expired; it reports how
// many it dropped. Idempotent.
func (s *Server) PruneKeys(ctx context.Context) (int, error) {
	_, dropped, err := s.pruneKeys(ctx)
	return dropped, err
}

// pruneKeys is PruneKeys, and also returns the stored ring it leaves.
func (s *Server) pruneKeys(ctx context.Context) (capability.KeyRing, int, error) {
	var ring capability.KeyRing
	dropped := 0
	err := s.store.Update(ctx, func(tx store.Txn) error {
		current, err := readKeyRing(tx)
		if err != nil {
			return err
		}
		ring = current.Prune(s.cfg.Clock.Now())
		dropped = len(current.Keys) - len(ring.Keys)
		if dropped == 0 {
			return nil
		}
		return writeKeyRing(tx, ring)
	})
	if err != nil || dropped == 0 {
		return ring, 0, err
	}
	s.keys.current.Store(&ring)
	s.log.Info("retired signing keys pruned", "dropped", dropped, "keys", len(ring.Keys))
	return ring, dropped, nil
}

// nextRetirement is the earliest time a key of ring may be pruned.
func nextRetirement(ring capability.KeyRing) time.Time {
	var next time.Time
	for _, k := range ring.Keys {
		if !k.RetireAfter.IsZero() && (next.IsZero() || k.RetireAfter.Before(next)) {
			next = k.RetireAfter
		}
	}
	if next.IsZero() {
		return next
	}
	return next.Add(time.Nanosecond) // Prune drops keys strictly after RetireAfter
}

func keyInfos(ring capability.KeyRing, now time.Time) []*tetherv1.SigningKeyInfo {
	out := make([]*tetherv1.SigningKeyInfo, 0, len(ring.Keys))
	for _, k := range ring.Keys {
		out = append(out, keyInfo(ring, k, now))
	}
	return out
}

func keyInfo(ring capability.KeyRing, k capability.SigningKey, now time.Time) *tetherv1.SigningKeyInfo {
	signer, err := ring.Signer(now)
	info := &tetherv1.SigningKeyInfo{
		Kid: k.ID, CreatedAt: timestamppb.New(k.CreatedAt), ActiveFrom: timestamppb.New(k.ActiveFrom),
		Signing: err == nil && signer.ID == k.ID,
	}
	if !k.RetireAfter.IsZero() {
		info.RetireAfter = timestamppb.New(k.RetireAfter)
	}
	return info
}
