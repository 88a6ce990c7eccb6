package supervisor

import (
	"bytes"
	"sync"
)

// The packs of the subtree index decoded last, kept so that a pack read
// again is not decoded again.
//
// Every step that walks the index reads it a chunk at a time from its
// cursor, and a chunk's entries rarely start and end on a pack's bounds:
// each read decodes the pack it starts in and the one it ends in, so
// every pack is decoded by two chunks of each step, and the mark's walk,
// which reads the entries the chunks before it listed, decodes each pack
// several times more. A pack is a thousand entries of JSON: decoding
// them was the part of a 10,000-agent termination that grew fastest
// (about 70 packs decoded for 11 stored; at 1,000 agents, two).
//
// It is a memo of decodeSubtreePack and nothing more: a pack is taken
// from it only when its key and its stored bytes are those decoded, so
// what a reader gets is what decoding the bytes it read would give,
// whatever the store, the termination or the moment. Callers must not
// change the entries it returns (readEntries copies them out).
type packMemo struct {
	mu    sync.Mutex
	packs [packMemoSize]decodedPack
	next  int // the slot the next pack replaces
}

// packMemoSize bounds the packs kept: 16 packs hold the index of a
// 16,000-node subtree, so that up to that size each pack is decoded once
// for all the steps, not once per step (beyond it, once per step: the
// mark's walk, the revocation, the record). A pack is at most
// subtreePackBytes of JSON, typically 40–45 KiB for 1,000 entries, and
// about 110 KiB decoded: the memo holds about 2.5 MiB at most in
// practice (14 MiB if every pack were at the bound).
const packMemoSize = 16

type decodedPack struct {
	key, value []byte
	first      int
	entries    []subtreeEntry
}

var subtreePacks packMemo

// decode is decodeSubtreePack, from the memo when it holds k with value v.
func (m *packMemo) decode(prefix, k, v []byte) (int, []subtreeEntry, error) {
	m.mu.Lock()
	for i := range m.packs {
		if p := &m.packs[i]; p.entries != nil && bytes.Equal(p.key, k) && bytes.Equal(p.value, v) {
			first, entries := p.first, p.entries
			m.mu.Unlock()
			return first, entries, nil
		}
	}
	m.mu.Unlock()
	first, entries, err := decodeSubtreePack(prefix, k, v)
	if err != nil {
		return 0, nil, err
	}
	m.mu.Lock()
	m.packs[m.next] = decodedPack{key: bytes.Clone(k), value: bytes.Clone(v), first: first, entries: entries}
	m.next = (m.next + 1) % packMemoSize
	m.mu.Unlock()
	return first, entries, nil
}
