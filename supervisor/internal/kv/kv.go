// Package kv holds the small helpers the supervisor's packages share to
// keep values in the store: JSON values and values in their stored
// encoding (internal/storecodec) under a key, the ids listed under a
// prefix, and caller text clipped to fit (valid UTF-8, which the store can
// encode). It holds no key layout: each package owns its own.
package kv

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
)

// PutJSON stores v as JSON under key.
func PutJSON(tx store.Txn, key []byte, v any) error { return put(tx, key, v, json.Marshal) }

// GetJSON decodes the JSON stored under key into v; a missing key is
// store.ErrNotFound.
func GetJSON(tx store.ReadTxn, key []byte, v any) error { return get(tx, key, v, json.Unmarshal) }

// Put stores v (a pointer to a struct with pb tags) in its stored
// encoding, written by internal/storecodec, under key.
func Put(tx store.Txn, key []byte, v any) error { return put(tx, key, v, storecodec.Marshal) }

// Get decodes the value Put stored under key into v; a missing key is
// store.ErrNotFound.
func Get(tx store.ReadTxn, key []byte, v any) error { return get(tx, key, v, storecodec.Unmarshal) }

func put(tx store.Txn, key []byte, v any, marshal func(any) ([]byte, error)) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return tx.Put(key, b)
}

func get(tx store.ReadTxn, key []byte, v any, unmarshal func([]byte, any) error) error {
	b, err := tx.Get(key)
	if err != nil {
		return err
	}
	return unmarshal(b, v)
}

// GetOf decodes the value stored under key with decode, for a value the
// caller names in its own words: a missing key is notFound (its message
// ends with missing and id), and a value that does not decode names its
// kind and id.
func GetOf(tx store.ReadTxn, key []byte, decode func([]byte) error, notFound error, missing, kind, id string) error {
	b, err := tx.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s%s", notFound, missing, id)
	}
	if err != nil {
		return err
	}
	if err := decode(b); err != nil {
		return fmt.Errorf("supervisor: decode %s %s: %w", kind, id, err)
	}
	return nil
}

// AppendIDs appends to ids the rest of every key under prefix (the ids an
// index lists there), in key order.
func AppendIDs(tx store.ReadTxn, ids []string, prefix []byte) ([]string, error) {
	err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		ids = append(ids, string(k[len(prefix):]))
		return nil
	})
	return ids, err
}

// IDsOf lists the ids under the index prefix of each owner, owner by owner
// and in key order under each, reading the prefixes together
// (store.Prefetch: one round trip on etcd).
func IDsOf(tx store.ReadTxn, owners []string, prefix func(owner string) []byte) ([]string, error) {
	if err := store.Prefetch(tx, nil, store.KeysOf(owners, prefix)); err != nil {
		return nil, err
	}
	var ids []string
	for _, o := range owners {
		var err error
		if ids, err = AppendIDs(tx, ids, prefix(o)); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// Clip shortens caller text quoted in an error message to 40 bytes.
func Clip(s string) string {
	if len(s) > 40 {
		return ClipUTF8(s, 40) + "…"
	}
	return s
}

// ClipUTF8 keeps at most n bytes of s, cut at a character boundary: a
// multi-byte character split in two is invalid UTF-8, which the store
// cannot encode (a caller could otherwise turn its own long text into an
// internal error, and a write that never happens).
func ClipUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
