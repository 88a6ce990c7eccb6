package privilege

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// TestRogue43JNotCalledTellsAQueuedHookFromACalledOne: with every hook
// slot held by a hook that does not answer, the privilege queued behind it
// is never called, and the registry says so (the record reads it, not "no
// answer"); the one called and silent is not "never called". A revocation
// begun before a restart (Resume) says the hook may have been called
// before; a node's record written forgets its marks.
func TestRogue43JNotCalledTellsAQueuedHookFromACalledOne(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, resume := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		rev := blockingRevoker{called: make(chan string, 4), gate: make(chan struct{})}
		r := &Privileges{Store: st, Clock: clk, Concurrency: 1, Handlers: map[string]PrivilegeRevoker{"file_lock": rev}}
		node := id.New(id.Node)
		var privs []Privilege
		for _, ext := range []string{"/locks/a", "/locks/b"} {
			p := Privilege{ID: id.New(id.Privilege), NodeID: node, Kind: "file_lock", ExternalID: ext, ExpiresAt: clk.Now().Add(time.Hour)}
			if err := st.Update(ctx, func(tx store.Txn) error {
				if err := PutIn(tx, p); err != nil {
					return err
				}
				return tx.Put(nodePrivKey(node, p.ID), nil)
			}); err != nil {
				t.Fatal(err)
			}
			privs = append(privs, p)
		}
		deadline := clk.Now().Add(time.Minute)
		if resume {
			err = r.Resume(ctx, privs, deadline, nil)
		} else {
			err = r.DispatchRead(ctx, privs, deadline, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		first := <-rev.called
		called, queued := privs[0], privs[1]
		if first != called.ID {
			called, queued = queued, called
		}
		if why := r.NotCalled(called); why != "" {
			t.Fatalf("resume=%v: the privilege whose hook was called reads %q", resume, why)
		}
		want := "never called"
		if resume {
			want = "not called again after the control plane restarted"
		}
		if why := r.NotCalled(queued); !strings.Contains(why, want) || !strings.Contains(why, "1 revoke-hook slots") {
			t.Fatalf("resume=%v: the privilege queued behind a hung hook reads %q, want %q", resume, why, want)
		}
		r.Forget([]string{node})
		if why := r.NotCalled(queued); why != "" {
			t.Fatalf("resume=%v: a forgotten node's privilege reads %q", resume, why)
		}
		cancel()
		close(rev.gate)
	}
}
