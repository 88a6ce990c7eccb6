package kv_test

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

type stored struct {
	Name  string `pb:"1"`
	Count int64  `pb:"2"`
}

// A value Put stores reads back with Get; a missing key is
// store.ErrNotFound. AppendIDs lists the ids under a prefix in key order,
// after those it is given, and nothing beyond the prefix; IDsOf does so
// for several owners' prefixes.
func TestPutGetAndAppendIDs(t *testing.T) {
	ctx := context.Background()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := &stored{Name: "n_1", Count: 3}
	err = st.Update(ctx, func(tx store.Txn) error {
		if err := kv.Put(tx, []byte("v/1"), want); err != nil {
			return err
		}
		for _, k := range []string{"ix/a/2", "ix/a/1", "ix/b/9", "ix/ab/7"} {
			if err := tx.Put([]byte(k), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = st.View(ctx, func(tx store.ReadTxn) error {
		got := &stored{}
		if err := kv.Get(tx, []byte("v/1"), got); err != nil {
			return err
		}
		if *got != *want {
			t.Errorf("Get read %+v, Put stored %+v", got, want)
		}
		if err := kv.Get(tx, []byte("v/2"), got); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a missing key reads %v, want store.ErrNotFound", err)
		}
		ids, err := kv.AppendIDs(tx, []string{"x"}, []byte("ix/a/"))
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(ids, []string{"x", "1", "2"}) {
			t.Errorf("AppendIDs = %q, want [x 1 2]", ids)
		}
		// IDsOf: owner by owner, in the owners' order; "a" is not "ab".
		ids, err = kv.IDsOf(tx, []string{"b", "a", "none"}, func(owner string) []byte { return []byte("ix/" + owner + "/") })
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(ids, []string{"9", "1", "2"}) {
			t.Errorf("IDsOf = %q, want [9 1 2]", ids)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
