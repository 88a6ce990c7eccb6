package grantstore

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The stored grants and tombstones keep the bytes of the tether.v1
// messages the previous version stored (proto.Marshal of the edge's
// conversion): what the store codec writes reads back as that message, and
// what the previous version wrote reads back as the same domain value.

func drawTime(t *rapid.T, label string) time.Time {
	if rapid.Bool().Draw(t, label+" absent") {
		return time.Time{}
	}
	return time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, label), rapid.Int64Range(0, 999_999_999).Draw(t, label+" nanos")).UTC()
}

func drawStrings(t *rapid.T, label string) []string {
	return rapid.SliceOfN(rapid.StringMatching(`[a-z:_0-9]{1,12}`), 0, 4).Draw(t, label)
}

func drawGrant(t *rapid.T) capability.Grant {
	return capability.Grant{
		GrantID:       rapid.StringMatching(`g_[0-9]{1,20}`).Draw(t, "grant_id"),
		ParentGrantID: rapid.StringMatching(`(g_[0-9]{1,20})?`).Draw(t, "parent"),
		HolderNodeID:  rapid.String().Draw(t, "holder"),
		Issuer:        rapid.String().Draw(t, "issuer"),
		Scopes:        drawStrings(t, "scopes"),
		NotBefore:     drawTime(t, "not_before"),
		ExpiresAt:     drawTime(t, "expires_at"),
		Chain:         drawStrings(t, "chain"),
		Revokers:      drawStrings(t, "revokers"),
		State:         capability.State(rapid.IntRange(0, 3).Draw(t, "state")),
		RevokedBy:     rapid.String().Draw(t, "revoked_by"),
		RevokedAt:     drawTime(t, "revoked_at"),
		RevokedVia:    rapid.String().Draw(t, "revoked_via"),
		Reason:        rapid.String().Draw(t, "reason"),
		CreatedAt:     drawTime(t, "created_at"),
	}
}

func drawTombstone(t *rapid.T) capability.Tombstone {
	return capability.Tombstone{
		Sequence:  rapid.Uint64().Draw(t, "sequence"),
		GrantID:   rapid.String().Draw(t, "grant_id"),
		RevokedAt: drawTime(t, "revoked_at"),
		DropAfter: drawTime(t, "drop_after"),
		Reason:    rapid.String().Draw(t, "reason"),
		Holder:    rapid.String().Draw(t, "holder"),
		Lineage:   rapid.String().Draw(t, "lineage"),
	}
}

// normal is the domain value as it reads back: empty slices and nil ones
// are one stored value.
func normal(v any) any {
	switch x := v.(type) {
	case capability.Grant:
		for _, s := range []*[]string{&x.Scopes, &x.Chain, &x.Revokers} {
			if len(*s) == 0 {
				*s = nil
			}
		}
		return x
	}
	return v
}

func TestStoredGrantsKeepTheirBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := drawGrant(t)
		raw, err := encodeGrant(g)
		if err != nil {
			t.Fatal(err)
		}
		var m tetherv1.Grant
		if err := proto.Unmarshal(raw, &m); err != nil {
			t.Fatalf("the stored grant does not decode as tether.v1.Grant: %v", err)
		}
		if want := wire.Grant(g); !proto.Equal(&m, want) {
			t.Fatalf("stored grant decodes as\n%v\nthe edge converts it to\n%v", &m, want)
		}
		old, err := proto.Marshal(wire.Grant(g)) // as the previous version stored it
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeGrant(g.GrantID, old)
		if err != nil {
			t.Fatalf("a grant the previous version stored does not decode: %v", err)
		}
		if !reflect.DeepEqual(normal(back), normal(g)) {
			t.Fatalf("a grant the previous version stored reads as\n%+v\nwant\n%+v", back, g)
		}
	})
}

func TestStoredTombstonesKeepTheirBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ts := drawTombstone(t)
		raw, err := encodeTombstone(ts)
		if err != nil {
			t.Fatal(err)
		}
		var m tetherv1.Tombstone
		if err := proto.Unmarshal(raw, &m); err != nil {
			t.Fatalf("the stored tombstone does not decode as tether.v1.Tombstone: %v", err)
		}
		if want := wire.Tombstone(ts); !proto.Equal(&m, want) {
			t.Fatalf("stored tombstone decodes as\n%v\nthe edge converts it to\n%v", &m, want)
		}
		old, err := proto.Marshal(wire.Tombstone(ts))
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeTombstone(old)
		if err != nil {
			t.Fatalf("a tombstone the previous version stored does not decode: %v", err)
		}
		if !reflect.DeepEqual(back, ts) {
			t.Fatalf("a tombstone the previous version stored reads as\n%+v\nwant\n%+v", back, ts)
		}
	})
}

// TestStoredGrantBytesAreThePreviousVersions: a fully populated grant is
// written byte for byte as the previous version wrote it (proto.Marshal is
// deterministic for a message without maps).
func TestStoredGrantBytesAreThePreviousVersions(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 123, time.UTC)
	g := capability.Grant{
		GrantID: "g_1", ParentGrantID: "g_0", HolderNodeID: "n_2", Issuer: "agent:n_1", Scopes: []string{"a", "b"},
		NotBefore: at, ExpiresAt: at.Add(time.Hour), Chain: []string{"g_0"}, Revokers: []string{"agent:n_1", "role:admin"},
		State: capability.StateRevoked, RevokedBy: "operator:x", RevokedAt: at.Add(time.Minute), RevokedVia: "g_0",
		Reason: "why", CreatedAt: at,
	}
	ts := capability.Tombstone{Sequence: 7, GrantID: "g_1", RevokedAt: at, DropAfter: at.Add(time.Hour), Reason: "why", Holder: "n_2", Lineage: "n_0"}
	for _, c := range []struct {
		name string
		enc  func() ([]byte, error)
		old  proto.Message
	}{
		{"grant", func() ([]byte, error) { return encodeGrant(g) }, wire.Grant(g)},
		{"tombstone", func() ([]byte, error) { return encodeTombstone(ts) }, wire.Tombstone(ts)},
	} {
		got, err := c.enc()
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.old)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: stored as %x, the previous version stored %x", c.name, got, want)
		}
	}
}

// BenchmarkGrantCodec: a grant stored and read by the store codec, and as
// the previous version did (through the tether.v1 message), in one run.
func BenchmarkGrantCodec(b *testing.B) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 123, time.UTC)
	g := capability.Grant{
		GrantID: "g_01JDZ0000000000000000000", ParentGrantID: "g_01JDZ0000000000000000001", HolderNodeID: "n_01JDZ0000000000000000002",
		Issuer: "agent:n_01JDZ0000000000000000003", Scopes: []string{"tools:shell", "tools:http"}, NotBefore: at, ExpiresAt: at.Add(time.Hour),
		Chain: []string{"g_01JDZ0000000000000000004", "g_01JDZ0000000000000000001"}, Revokers: []string{"agent:n_1", "operator:root", "role:admin", "role:security"},
		State: capability.StateActive, CreatedAt: at,
	}
	raw, err := encodeGrant(g)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("storecodec/encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := encodeGrant(g); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto/encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := proto.Marshal(wire.Grant(g)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("storecodec/decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeGrant(g.GrantID, raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto/decode", func(b *testing.B) {
		for b.Loop() {
			var m tetherv1.Grant
			if err := proto.Unmarshal(raw, &m); err != nil {
				b.Fatal(err)
			}
			_ = wire.GrantFromProto(&m)
		}
	})
}
