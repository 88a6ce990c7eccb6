package store

import (
	"fmt"

	"github.com/tetherhq/tether/internal/fault"
)

// Limits every backend enforces, so that a caller that works against one
// backend works against all of them. They sit well inside etcd's default
// request limit (1.5 MiB) and Badger's per-entry limits.
const (
	// MaxKeySize is the largest key, in bytes, that Put accepts.
	MaxKeySize = 4 << 10
	// MaxValueSize is the largest value, in bytes, that Put accepts. It is
	// 1 MB rather than 1 MiB so that every value stays below Badger's value
	// threshold (1 MiB): values then live in the LSM tree, Badger's value
	// log stays empty and never needs garbage collection, and in-memory
	// Badger, which mishandles a value of exactly 1 MiB, is safe.
	MaxValueSize = 1_000_000
)

// ErrInvalidKey is returned for keys the store cannot hold: empty keys, keys
// longer than MaxKeySize, and keys in the reserved namespace (first byte
// 0x00), where backends keep their own metadata such as the revision.
var ErrInvalidKey = fault.New(fault.Internal, "store: invalid key")

// CheckKey reports whether key may be read or written by callers.
func CheckKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeySize:
		return fmt.Errorf("%w: key of %d bytes exceeds the %d-byte limit", ErrInvalidKey, len(key), MaxKeySize)
	case key[0] == ReservedKeyByte:
		return fmt.Errorf("%w: keys starting with byte 0x00 are reserved for the store's metadata", ErrInvalidKey)
	}
	return nil
}

// CheckPrefix reports whether prefix may be scanned or watched. An empty
// prefix means every caller key; the reserved namespace is never visible.
func CheckPrefix(prefix []byte) error {
	if len(prefix) > 0 && prefix[0] == ReservedKeyByte {
		return fmt.Errorf("%w: prefix 0x00 is reserved for the store's metadata", ErrInvalidKey)
	}
	return nil
}

// CheckValue reports whether value fits the store's limit.
func CheckValue(value []byte) error {
	if len(value) > MaxValueSize {
		return fmt.Errorf("%w: value of %d bytes exceeds the %d-byte limit", ErrTooLarge, len(value), MaxValueSize)
	}
	return nil
}

// ReservedKeyByte starts every key the store keeps for itself.
const ReservedKeyByte = 0x00

// ScanLowerBound is where a scan of prefix starting at start begins: the
// larger of the two, and never inside the reserved namespace.
func ScanLowerBound(prefix, start []byte) []byte {
	lower := prefix
	if string(start) > string(lower) {
		lower = start
	}
	if len(lower) == 0 || lower[0] == ReservedKeyByte {
		// Every key starting with 0x00 sorts before 0x01, so seeking there
		// skips the whole reserved namespace.
		return []byte{ReservedKeyByte + 1}
	}
	return lower
}
