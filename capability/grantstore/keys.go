package grantstore

import (
	"fmt"
	"strconv"
)

// Store key layout: see the package documentation. Every index entry is
// written in the same transaction as the grant it points at.
const (
	prefixGrant     = "grants/grant/"
	prefixHolder    = "grants/holder/"
	prefixChild     = "grants/child/"
	prefixDerived   = "grants/derived/"
	prefixIssued    = "grants/issued/"
	prefixTombstone = "grants/tombstone/"
	prefixMark      = "grants/mark/"
)

var (
	feedHeadKey      = []byte("grants/feed/head")
	feedCompactedKey = []byte("grants/feed/compacted")
)

func grantKey(id string) []byte             { return []byte(prefixGrant + id) }
func holderPrefix(node string) []byte       { return []byte(prefixHolder + node + "/") }
func holderKey(node, id string) []byte      { return []byte(prefixHolder + node + "/" + id) }
func childPrefix(parent string) []byte      { return []byte(prefixChild + parent + "/") }
func childKey(parent, id string) []byte     { return []byte(prefixChild + parent + "/" + id) }
func derivedPrefix(ancestor string) []byte  { return []byte(prefixDerived + ancestor + "/") }
func derivedKey(ancestor, id string) []byte { return []byte(prefixDerived + ancestor + "/" + id) }
func issuedKey(unixNanos int64, id string) []byte {
	return fmt.Appendf(nil, "%s%020d/%s", prefixIssued, unixNanos, id)
}
func tombstoneKey(seq uint64) []byte { return fmt.Appendf(nil, "%s%020d", prefixTombstone, seq) }
func markKey(seq uint64) []byte      { return fmt.Appendf(nil, "%s%020d", prefixMark, seq) }

// sequenceOf parses the sequence at the end of a tombstone or mark key.
func sequenceOf(key []byte, prefix string) (uint64, error) {
	if len(key) != len(prefix)+20 || string(key[:len(prefix)]) != prefix {
		return 0, fmt.Errorf("%w: key %q is not a %s<sequence> key", ErrCorrupt, key, prefix)
	}
	seq, err := strconv.ParseUint(string(key[len(prefix):]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: key %q: %v", ErrCorrupt, key, err)
	}
	return seq, nil
}

// idAfter returns the id part of an index key under prefix.
func idAfter(key, prefix []byte) string { return string(key[len(prefix):]) }
