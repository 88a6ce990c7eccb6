package store_test

import (
	"context"
	"log/slog"
	"reflect"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// IDsAfter pages an index of prefix + id keys: up to limit ids after the
// one given, whether more follow, and nothing outside the prefix; Read
// returns what its View read.
func TestIDsAfterPagesAnIndexAndReadReturnsWhatItRead(t *testing.T) {
	ctx := context.Background()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.Update(ctx, func(tx store.Txn) error {
		for _, k := range []string{"ix/a/3", "ix/a/1", "ix/a/2", "ix/ab/9", "ix/b/1"} {
			if err := tx.Put([]byte(k), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	type page struct {
		IDs  []string
		More bool
	}
	for _, c := range []struct {
		after string
		limit int
		want  page
	}{
		{"", 2, page{[]string{"1", "2"}, true}},
		{"2", 2, page{[]string{"3"}, false}},
		{"", 3, page{[]string{"1", "2", "3"}, false}},
		{"3", 2, page{nil, false}},
	} {
		got, err := store.Read(ctx, st, func(tx store.ReadTxn) (page, error) {
			ids, more, err := store.IDsAfter(tx, []byte("ix/a/"), c.after, c.limit)
			return page{ids, more}, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("IDsAfter(after %q, limit %d) = %+v, want %+v", c.after, c.limit, got, c.want)
		}
	}
}
