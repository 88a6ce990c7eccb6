// Package compattest checks, for tests, that a domain type stores the
// bytes of the tether.v1 message it replaced: a fully populated value this
// version stores reads with proto.Unmarshal as the RPC edge shows it (so
// the previous version, which stored and read the message itself, reads
// it), and a message the previous version stored reads back as the same
// value.
package compattest

import (
	"context"
	"log/slog"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/internal/populated"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// Stored says how one domain type is stored and shown.
type Stored[T any, M proto.Message] struct {
	Kind  string                                        // "node", "call": for messages
	Full  func() *T                                     // a value with every field set
	SetID func(v *T, id string)                         // gives the value another id
	Key   func(id string) []byte                        // where a value is stored
	Put   func(tx store.Txn, v *T) error                // stores a value
	Get   func(tx store.ReadTxn, id string) (*T, error) // reads one back
	Wire  func(v *T) M                                  // the edge's conversion
	// StoreOnly, when set, clears the fields the value stores beyond the
	// message (bookkeeping the edge never shows, under field numbers the
	// message does not use): the stored bytes must read as the message
	// once those unknown fields are dropped, and a message the previous
	// version stored reads back with them cleared.
	StoreOnly func(v *T)
}

// Check runs both directions on a Badger store on disk and returns the
// bytes this version stored for Full() and the bytes of the message the
// previous version stored for Full() with id older, for a caller's own
// decoders to check further.
func Check[T any, M proto.Message](t *testing.T, s Stored[T, M], id, older string) (stored, previous []byte) {
	t.Helper()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	v := s.Full()
	if unset := populated.Unset(v); len(unset) > 0 {
		t.Fatalf("the test %s leaves %v unset: set them, or the test does not cover them", s.Kind, unset)
	}

	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := s.Put(tx, v); err != nil {
			return err
		}
		stored, err = tx.Get(s.Key(id))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := s.Wire(v)
	m := want.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(stored, m); err != nil {
		t.Fatalf("the stored %s is not a %s: %v", s.Kind, want.ProtoReflect().Descriptor().FullName(), err)
	}
	if s.StoreOnly != nil {
		m.ProtoReflect().SetUnknown(nil)
	}
	if !proto.Equal(m, want) {
		t.Fatalf("the stored %s reads as\n%v\nwant (as the edge shows it)\n%v", s.Kind, m, want)
	}

	wantOld := s.Full()
	s.SetID(wantOld, older)
	if previous, err = proto.Marshal(s.Wire(wantOld)); err != nil {
		t.Fatal(err)
	}
	if s.StoreOnly != nil {
		s.StoreOnly(wantOld)
	}
	var got *T
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := tx.Put(s.Key(older), previous); err != nil {
			return err
		}
		got, err = s.Get(tx, older)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantOld) {
		t.Fatalf("a %s the previous version stored reads as\n%+v\nwant\n%+v", s.Kind, got, wantOld)
	}
	return stored, previous
}
