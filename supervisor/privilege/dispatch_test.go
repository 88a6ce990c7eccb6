package privilege

import (
	"context"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

type blockingRevoker struct {
	called chan string
	gate   chan struct{}
}

func (b blockingRevoker) RevokePrivilege(ctx context.Context, p Privilege) error {
	b.called <- p.ID
	select {
	case <-b.gate:
	case <-ctx.Done():
	}
	return nil
}

// A termination reads a node's privileges, then dispatches those still
// undecided. When the revocation it dispatched earlier (or another
// termination's, before a take-over) persists its outcome between that
// read and the dispatch, the read is stale: the hook must not be called a
// second time (a revoke webhook is told once; seen in a loaded run as an
// operator's repeated drain calling the lock's hook again).
func TestADispatchOfAStaleReadDoesNotRevokeAgainWhatWasDecided(t *testing.T) {
	ctx := context.Background()
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rev := blockingRevoker{called: make(chan string, 4), gate: make(chan struct{})}
	r := &Privileges{Store: st, Clock: clk, Handlers: map[string]PrivilegeRevoker{"file_lock": rev}}
	node := id.New(id.Node)
	p := Privilege{ID: id.New(id.Privilege), NodeID: node, Kind: "file_lock", ExternalID: "/locks/p", ExpiresAt: clk.Now().Add(time.Hour)}
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := PutIn(tx, p); err != nil {
			return err
		}
		return tx.Put(nodePrivKey(node, p.ID), nil)
	}); err != nil {
		t.Fatal(err)
	}
	read := func() []Privilege {
		privs, err := store.Read(ctx, st, func(tx store.ReadTxn) ([]Privilege, error) { return PrivilegesIn(tx, []string{node}) })
		if err != nil {
			t.Fatal(err)
		}
		return privs
	}
	stale := read()
	if len(stale) != 1 || stale[0].Outcome != "" {
		t.Fatalf("read %+v, want the one undecided privilege", stale)
	}

	decided := make(chan struct{}, 1)
	if err := r.DispatchRead(ctx, stale, clk.Now().Add(time.Minute), func() { decided <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	<-rev.called
	close(rev.gate) // the hook answers; its outcome is persisted
	<-decided
	if got := read(); got[0].Outcome != OutcomeRevoked {
		t.Fatalf("the first revocation persisted %q, want revoked", got[0].Outcome)
	}

	// The stale read is dispatched again (the reconciler's next pass, or a
	// take-over's, read it before the outcome was persisted).
	rev2 := blockingRevoker{called: rev.called, gate: make(chan struct{})}
	t.Cleanup(func() { close(rev2.gate) })
	r.Handlers["file_lock"] = rev2
	if err := r.DispatchRead(ctx, stale, clk.Now().Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	started := r.inFlight[p.ID]
	r.mu.Unlock()
	if started {
		t.Fatal("a dispatch of a stale read started revoking again a privilege whose outcome is persisted")
	}
}
