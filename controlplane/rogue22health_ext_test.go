package controlplane_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// probeCountingStore is the server's real Badger store, counting the
// Views that read nothing but the store's revision: /healthz's probe of
// the store (on etcd a request to the cluster each).
type probeCountingStore struct {
	store.Store
	probes atomic.Int64
}

type probeRead struct {
	store.ReadTxn
	other bool
}

func (r *probeRead) Get(key []byte) ([]byte, error) { r.other = true; return r.ReadTxn.Get(key) }
func (r *probeRead) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	r.other = true
	return r.ReadTxn.Scan(prefix, start, fn)
}

func (s *probeCountingStore) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error {
		r := &probeRead{ReadTxn: tx}
		err := fn(r)
		if !r.other {
			s.probes.Add(1)
		}
		return err
	})
}

// TestARogueCannotMakeHealthzReadTheStoreAtWill: /healthz answers without
// a credential and is not budgeted (an orchestrator's probe must not be
// locked out by a rogue on its address), and each request read the store:
// on etcd a request to the cluster, as fast as a rogue with no credential
// sent, on as many connections as it opened — 50 probes, 50 store reads.
// Probes now share the store's answer for a second on the server's clock,
// and one read at a time: 50 probes within the second, one read. (Fails
// if the probes within a second read the store more than once, or a probe
// after it does not read it again.)
func TestARogueCannotMakeHealthzReadTheStoreAtWill(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &probeCountingStore{Store: b}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = st })
	probe := func() {
		t.Helper()
		resp, err := srv.HTTP.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz: %s", resp.Status)
		}
	}
	probe()
	st.probes.Store(0)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			for range 10 {
				resp, err := srv.HTTP.Get(srv.URL + "/healthz")
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	if n := st.probes.Load(); n > 0 {
		t.Errorf("50 probes of /healthz within the second of the first read the store %d times, want none (the first's answer)", n)
	}
	clk.Advance(time.Second)
	probe()
	if n := st.probes.Load(); n != 1 {
		t.Errorf("a probe a second later read the store %d times, want once", n)
	}
}
