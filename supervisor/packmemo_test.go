package supervisor

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// A pack read again comes from the memo only while its stored bytes are
// the ones decoded: a pack stored again under the same key with other
// entries (another store, a test, a key reused) is decoded afresh, and a
// reader that changes what it was given changes nothing for the next.
func TestTheDecodedPacksAreTakenOnlyForTheBytesTheyCameFrom(t *testing.T) {
	_, st := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 0)
	ctx := context.Background()
	term := &Termination{ID: "term_memo", Counts: Counts{Listed: 4}}
	pack := func(prefix string) []subtreeEntry {
		var out []subtreeEntry
		for i := range term.Counts.Listed {
			out = append(out, subtreeEntry{Node: fmt.Sprintf("%s_%d", prefix, i), Reach: ReachMark})
		}
		return out
	}
	read := func() []subtreeEntry {
		t.Helper()
		got, err := store.Read(ctx, st, func(tx store.ReadTxn) ([]subtreeEntry, error) {
			return readEntries(tx, term, 0, term.Counts.Listed)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, want := range [][]subtreeEntry{pack("node"), pack("other")} {
		if err := st.Update(ctx, func(tx store.Txn) error { return putSubtreeEntries(tx, term.ID, 0, want) }); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			got := read()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("read %v, want %v", got, want)
			}
			got[0].Node, got[1].Reach = "changed", ReachLeave
		}
	}
}
