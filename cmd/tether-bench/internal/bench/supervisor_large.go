package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tetherhq/tether/internal/etcdlocal"
)

func init() {
	Register("supervisor/terminate-beyond-one-txn", supervisorTerminateBeyondOneTxn)
}

// terminateBeyondOneTxnWithin bounds each termination of the scenario: at
// the rate the design aims for (10,000 agents in a second on Badger, etcd
// within 3× of it) they take seconds; chunked, a 120,001-agent one was
// still reconciling after a minute on the shared machine (load 15).
const terminateBeyondOneTxnWithin = 2 * time.Minute

// supervisorTerminateBeyondOneTxn terminates, in abort mode, a swarm larger
// than one store transaction can hold: 120,001 agents on Badger (an Update
// holds at most about 104,000 writes and 10 MB) and 20,001 on etcd (a
// request holds at most 16 MiB: about 10,000 nodes' worth), every agent
// holding a grant delegated from its parent's (the tree of buildWideTree:
// 120 or 20 children below the root, 999 below each), a tool call in
// flight under each child. It reports the time until terminated and the
// record lists every agent, or, if the termination fails or does not
// finish within terminateBeyondOneTxnWithin, how long it was given
// (…/unfinished/…). The 1,000,000-agent termination is million/badger's.
func supervisorTerminateBeyondOneTxn(ctx context.Context, r *Report) error {
	var errs []error
	srv, err := startServer(ctx, r, disableRateLimit)
	if err != nil {
		return err
	}
	errs = append(errs, terminateWideSwarm(ctx, r, "supervisor/terminate-beyond-one-txn/badger", srv, 120, 999))
	srv.Stop()

	dir, err := os.MkdirTemp(r.Dir, "tether-bench-etcd-terminate-*")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer os.RemoveAll(dir)
	cluster, err := etcdlocal.Start(ctx, etcdlocal.Config{Dir: dir})
	if errors.Is(err, etcdlocal.ErrNoBinary) {
		fmt.Fprintln(os.Stderr, "  supervisor/terminate-beyond-one-txn: etcd not installed (apt-get install etcd-server): Badger alone")
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("start etcd: %w", err))...)
	}
	defer cluster.Stop()
	esrv, stop, err := startEtcdServer(ctx, r, cluster)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer stop()
	errs = append(errs, terminateWideSwarm(ctx, r, "supervisor/terminate-beyond-one-txn/etcd", esrv, 20, 999))
	return errors.Join(errs...)
}

// terminateWideSwarm builds a swarm of 1 + top + top*per agents with their
// grants (buildWideTree) and terminates it (terminateSwarm).
func terminateWideSwarm(ctx context.Context, r *Report, name string, srv *benchServer, top, per int) error {
	root, grant, err := rootWithGrant(ctx, srv, "bench-swarm", time.Hour, "tool:*")
	if err != nil {
		return err
	}
	tree, err := buildWideTree(ctx, srv, root, grant.Grant, top, per, func(done int) {
		fmt.Fprintf(os.Stderr, "  %s: %d agents built\n", name, done)
	})
	if err != nil {
		return fmt.Errorf("%s: build: %w", name, err)
	}
	if err := terminateSwarm(ctx, r, name, srv, tree, 1+top+top*per, terminateBeyondOneTxnWithin); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
