package capability

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/tetherhq/tether/internal/fault"
)

// ErrUnknownKey is returned when a token names a kid the ring does not hold.
var ErrUnknownKey = fault.New(fault.Unauthenticated, "capability: unknown signing key")

// SigningKey is one Ed25519 key of the ring.
type SigningKey struct {
	ID         string             `json:"kid"`
	Private    ed25519.PrivateKey `json:"private,omitempty"`
	Public     ed25519.PublicKey  `json:"public"`
	CreatedAt  time.Time          `json:"created_at"`
	ActiveFrom time.Time          `json:"active_from"`
	// RetireAfter is when the key may leave JWKS: the expiry of the last
	// token it could have signed. Zero while the key is still signing.
	RetireAfter time.Time `json:"retire_after,omitzero"`
}

// NewSigningKey generates a key that becomes the signer at activeFrom.
func NewSigningKey(random io.Reader, now, activeFrom time.Time) (SigningKey, error) {
	if random == nil {
		random = rand.Reader
	}
	pub, priv, err := ed25519.GenerateKey(random)
	if err != nil {
		return SigningKey{}, fmt.Errorf("capability: generate key: %w", err)
	}
	sum := sha256.Sum256(pub)
	return SigningKey{
		ID:         base64.RawURLEncoding.EncodeToString(sum[:12]),
		Private:    priv,
		Public:     pub,
		CreatedAt:  now,
		ActiveFrom: activeFrom,
	}, nil
}

// KeyRing is the set of signing keys. It is a value: the control plane loads
// it from the store, changes it (Rotate, Prune) and writes it back.
//
// The ring publishes a key in JWKS before it signs anything (ActiveFrom in
// the future) so verifiers that cache JWKS already know it, and keeps an old
// key until every token it signed has expired.
type KeyRing struct {
	Keys []SigningKey `json:"keys"`
}

// Signer returns the key that signs at now: the newest key whose ActiveFrom
// is not after now.
func (r KeyRing) Signer(now time.Time) (SigningKey, error) {
	var best *SigningKey
	for i := range r.Keys {
		k := &r.Keys[i]
		// A retiring key keeps signing until its successor is active: the
		// newest active key wins below.
		if k.ActiveFrom.After(now) || len(k.Private) == 0 {
			continue
		}
		// Later entries win ties: Rotate appends, so the newest key signs.
		if best == nil || !k.ActiveFrom.Before(best.ActiveFrom) {
			best = k
		}
	}
	if best == nil {
		return SigningKey{}, fmt.Errorf("%w: no active signing key", ErrUnknownKey)
	}
	return *best, nil
}

// Public returns the public key for kid.
func (r KeyRing) Public(kid string) (ed25519.PublicKey, error) {
	for _, k := range r.Keys {
		if k.ID == kid {
			return k.Public, nil
		}
	}
	return nil, ErrUnknownKey
}

// Rotate adds a new key that becomes the signer at now+publishAhead and marks
// the current signers to retire once tokens they could sign have expired
// (activation time + maxTokenTTL).
func (r KeyRing) Rotate(random io.Reader, now time.Time, publishAhead, maxTokenTTL time.Duration) (KeyRing, SigningKey, error) {
	// The new key never activates before a key published earlier: then the
	// signer order is the publication order, and every older key's last
	// token expires by the new key's activation + maxTokenTTL.
	activeFrom := now.Add(publishAhead)
	for _, k := range r.Keys {
		if k.ActiveFrom.After(activeFrom) {
			activeFrom = k.ActiveFrom
		}
	}
	next, err := NewSigningKey(random, now, activeFrom)
	if err != nil {
		return r, SigningKey{}, err
	}
	out := KeyRing{Keys: make([]SigningKey, 0, len(r.Keys)+1)}
	for _, k := range r.Keys {
		if k.RetireAfter.IsZero() {
			k.RetireAfter = next.ActiveFrom.Add(maxTokenTTL)
		}
		out.Keys = append(out.Keys, k)
	}
	out.Keys = append(out.Keys, next)
	return out, next, nil
}

// Prune drops keys whose every token has expired.
func (r KeyRing) Prune(now time.Time) KeyRing {
	out := KeyRing{}
	for _, k := range r.Keys {
		if !k.RetireAfter.IsZero() && now.After(k.RetireAfter) {
			continue
		}
		out.Keys = append(out.Keys, k)
	}
	return out
}

// jwk is the RFC 8037 OKP form of an Ed25519 public key.
type jwk struct {
	KeyType   string `json:"kty"`
	Curve     string `json:"crv"`
	X         string `json:"x"`
	KeyID     string `json:"kid"`
	Use       string `json:"use"`
	Algorithm string `json:"alg"`
}

// JWKS renders the public half of the ring as a JSON Web Key Set.
func (r KeyRing) JWKS() ([]byte, error) {
	keys := make([]jwk, 0, len(r.Keys))
	for _, k := range r.Keys {
		keys = append(keys, jwk{
			KeyType: "OKP", Curve: "Ed25519", Use: "sig", Algorithm: "EdDSA",
			KeyID: k.ID, X: base64.RawURLEncoding.EncodeToString(k.Public),
		})
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].KeyID < keys[j].KeyID })
	return json.Marshal(struct {
		Keys []jwk `json:"keys"`
	}{keys})
}

// ParseJWKS reads a JSON Web Key Set of Ed25519 keys into a public-only ring.
// A kid listed for more than one Ed25519 key is left out of it.
func ParseJWKS(data []byte) (KeyRing, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return KeyRing{}, fmt.Errorf("capability: parse jwks: %w", err)
	}
	var ring KeyRing
	for _, k := range set.Keys {
		if k.KeyType != "OKP" || k.Curve != "Ed25519" {
			continue
		}
		pub, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(pub) != ed25519.PublicKeySize || k.KeyID == "" {
			return KeyRing{}, fmt.Errorf("capability: parse jwks: key %q is malformed", k.KeyID)
		}
		ring.Keys = append(ring.Keys, SigningKey{ID: k.KeyID, Public: ed25519.PublicKey(pub)})
	}
	// A kid listed twice names no key: Public would give the first, the
	// TypeScript and Python verifiers the last, so a token signed by
	// either read differently per SDK. All of them ignore such a kid.
	listed := make(map[string]int, len(ring.Keys))
	for _, k := range ring.Keys {
		listed[k.ID]++
	}
	ring.Keys = slices.DeleteFunc(ring.Keys, func(k SigningKey) bool { return listed[k.ID] > 1 })
	return ring, nil
}
