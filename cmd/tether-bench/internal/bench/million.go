package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

func init() {
	RegisterLarge("million/badger", millionBadger)
	RegisterLarge("million/etcd", millionEtcd)
}

// millionBadger is the 1,000,000-agent swarm on one node's Badger store:
// a root, 1,000 children and 999 grandchildren under each (1,000,000
// descendants), every agent holding a grant delegated from its parent's.
// See largeSwarm for what it measures.
func millionBadger(ctx context.Context, r *Report) error {
	srv, err := startServer(ctx, r, disableRateLimit)
	if err != nil {
		return err
	}
	defer srv.Stop()
	return largeSwarm(ctx, r, "million/badger", srv, srv.dir, 0, 1000, 999)
}

// millionEtcd is the same at 100,000 descendants (a root, 100 children,
// 999 grandchildren each) on a local single-member etcd, the control plane
// one replica that leads. It also reports etcd's own resident memory and
// disk per agent.
func millionEtcd(ctx context.Context, r *Report) error {
	return withEtcdServer(ctx, r, "million/etcd", "tether-bench-etcd-large-*", func(cluster *etcdlocal.Cluster, srv *benchServer) error {
		dir := cluster.Members[0].Dir // the member's data: its disk per agent
		pid, _ := processWithArg(dir)
		return largeSwarm(ctx, r, "million/etcd", srv, dir, pid, 100, 999)
	})
}

// largeSwarm builds a swarm of 1 + top + top*per agents below one root
// (see buildWideTree) and reports, under name:
//
//   - build-agents-per-s: how fast the setup wrote it (spawns through the
//     agent tree's tree.Tree, grants in batches; no RPC, no credentials);
//   - heap-per-agent, rss-per-agent: the process's Go heap in use and
//     resident memory after a GC (and the heap's pages returned to the
//     system), grown from before the build, over the agents; the process
//     is the whole control plane (with its store when it is Badger) and
//     the bench's client, which holds nothing per agent; with peerPID,
//     etcd-rss-per-agent likewise for that process; disk-per-agent: the
//     blocks under dataDir;
//   - revoke-to-verifier-reject and revoke-rpc at top+top*per descendants
//     (as capability/revoke-subtree), beside commit-floor-before-revoke
//     (the median of 21 lone durable commits just before: a revocation is
//     one commit, and the store may still be busy with the build's
//     writes), and marker-background, the time
//     until the stored states of every descendant grant are rewritten;
//   - terminate-abort: Terminate of the whole subtree in abort mode, one
//     tool call in flight under each of the root's children (each call
//     under a fresh root grant of its agent: the agents' delegated grants
//     were revoked by the step before, so the termination finds them
//     revoked and records them so), until the termination is terminated
//     and its record lists every agent; and its CPU time. A termination that fails or does not finish within
//     Report.StepTimeout is reported as terminate-abort/unfinished (the
//     time it was given), its last state logged, and returned as the
//     scenario's error after the other figures.
func largeSwarm(ctx context.Context, r *Report, name string, srv *benchServer, dataDir string, peerPID, top, per int) error {
	r = r.logging(os.Stderr)
	agents := 1 + top + top*per
	descendants := agents - 1
	verifier, stopVerifier, err := startBenchVerifier(ctx, srv, -1)
	if err != nil {
		return err
	}
	defer stopVerifier()

	heapBefore, rssBefore := memoryNow()
	peerBefore, _ := residentBytes(peerPID)
	root, rootGrant, err := rootWithGrant(ctx, srv, "bench-swarm", 6*time.Hour, "tool:*", "s3:read:logs/*")
	if err != nil {
		return err
	}
	start := time.Now()
	tree, err := buildWideTree(ctx, srv, root, rootGrant.Grant, top, per, func(done int) {
		fmt.Fprintf(os.Stderr, "  %s: %d of %d agents, %.0f/s\n", name, done, agents, float64(done)/time.Since(start).Seconds())
	})
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	r.Add(name+"/build-agents-per-s", float64(agents)/time.Since(start).Seconds(), "agents/s")

	heapAfter, rssAfter := memoryNow()
	r.Add(fmt.Sprintf("%s/heap-per-agent/agents=%d", name, agents), perAgent(heapAfter, heapBefore, agents), "bytes")
	r.Add(fmt.Sprintf("%s/rss-per-agent/agents=%d", name, agents), perAgent(rssAfter, rssBefore, agents), "bytes")
	r.Add(fmt.Sprintf("%s/heap-in-use/agents=%d", name, agents), float64(heapAfter)/(1<<20), "MiB")
	r.Add(fmt.Sprintf("%s/rss/agents=%d", name, agents), float64(rssAfter)/(1<<20), "MiB")
	if peerAfter, ok := residentBytes(peerPID); ok && peerPID != 0 {
		r.Add(fmt.Sprintf("%s/etcd-rss-per-agent/agents=%d", name, agents), perAgent(peerAfter, peerBefore, agents), "bytes")
	}
	if disk, ok := diskBytes(dataDir); ok {
		r.Add(fmt.Sprintf("%s/disk-per-agent/agents=%d", name, agents), float64(disk)/float64(agents), "bytes")
	}

	// Revoke the root's grant: every agent's grant descends from it.
	refreshed, err := srv.Admin.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: tree.leafGrant}))
	if err != nil {
		return err
	}
	if _, err := verifier.Verify(ctx, refreshed.Msg.Token); err != nil {
		return fmt.Errorf("a leaf's token before the revocation: %w", err)
	}
	// The store's commit floor just before, beside the revocation: a
	// revocation is one commit, and right after a million writes the
	// store may still be compacting them.
	floor, err := commitFloor(ctx, srv, 21)
	if err != nil {
		return err
	}
	r.Add(name+"/commit-floor-before-revoke/p50", ms(floor), "ms")
	start = time.Now()
	roundTrip, rpc, err := revokeToReject(ctx, srv, verifier, rootGrant.Grant.GrantId, refreshed.Msg.Token)
	if err != nil {
		return err
	}
	r.Add(fmt.Sprintf("%s/revoke-to-verifier-reject/descendants=%d", name, descendants), ms(roundTrip), "ms")
	r.Add(fmt.Sprintf("%s/revoke-rpc/descendants=%d", name, descendants), ms(rpc), "ms")
	var errs []error
	if err := waitForMarker(ctx, srv.Grants(), r.stepTimeout()); err != nil {
		fmt.Fprintf(os.Stderr, "  %s: marker: %v\n", name, err)
		errs = append(errs, fmt.Errorf("marker: %w", err))
	} else {
		r.Add(fmt.Sprintf("%s/marker-background/descendants=%d", name, descendants), ms(time.Since(start)), "ms")
	}

	if err := terminateSwarm(ctx, r, name, srv, tree, agents, r.stepTimeout()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// terminateSwarm terminates tree's whole swarm of agents in abort mode,
// one tool call in flight on each of tree.sample, and reports under name
// the time from Terminate until the termination is terminated and its
// record lists every agent (terminate-abort/agents=N), and the process's
// CPU time over it. A termination that fails or does not finish within
// the bound is reported as terminate-abort/unfinished/agents=N (the time
// until it failed or was given up), its last state logged and returned.
func terminateSwarm(ctx context.Context, r *Report, name string, srv *benchServer, tree wideTree, agents int, within time.Duration) error {
	calls, stopGate, err := callsInFlightOn(ctx, srv, tree.sample)
	if err != nil {
		return err
	}
	cpuBefore, cpuOK := processCPU()
	elapsed, nodes, last, err := timeTerminationWithin(ctx, srv, tree.root, within)
	cpuAfter, _ := processCPU()
	acked := stopGate()
	switch {
	case err != nil:
		err = fmt.Errorf("terminate %d agents: %w after %v, last state %s", agents, err, elapsed.Round(time.Millisecond), last)
	case nodes != agents:
		err = fmt.Errorf("terminate: the record of a %d-agent subtree lists %d nodes", agents, nodes)
	case acked != calls:
		err = fmt.Errorf("terminate: %d calls in flight, %d cancel acks", calls, acked)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "  %s: %v\n", name, err)
		r.Add(fmt.Sprintf("%s/terminate-abort/unfinished/agents=%d", name, agents), ms(elapsed), "ms")
		return err
	}
	r.Add(fmt.Sprintf("%s/terminate-abort/agents=%d", name, agents), ms(elapsed), "ms")
	if cpuOK {
		r.Add(fmt.Sprintf("%s/terminate-abort-cpu/agents=%d", name, agents), ms(cpuAfter-cpuBefore), "ms")
	}
	return nil
}

// commitFloor is the median of n durable store Updates of one small key,
// one after another.
func commitFloor(ctx context.Context, srv *benchServer, n int) (time.Duration, error) {
	var ds []time.Duration
	key := []byte("bench/commit-floor")
	for range n {
		start := time.Now()
		if err := srv.Store().Update(ctx, func(tx store.Txn) error { return tx.Put(key, storeValue) }); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(start))
	}
	return median(ds), nil
}

// memoryNow is the Go heap in use and the process's resident memory after
// a GC that also returns free pages to the system.
func memoryNow() (heap, rss uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	rss, _ = residentBytes(0)
	return m.HeapInuse, rss
}

func perAgent(after, before uint64, agents int) float64 {
	return (float64(after) - float64(before)) / float64(agents)
}

// wideTree is what buildWideTree built.
type wideTree struct {
	root      string
	leafGrant string   // a grandchild's grant
	sample    []string // one grandchild of each of the root's children
}

// buildWideTree writes top children below root and per children below each
// of them. Every node is a real node, spawned through the agent tree's
// Tree as the Spawn handler does (one durable Update each, which checks
// the parent and the limits and keeps the child count), without the RPC
// and the credential; every node holds a grant delegated from its
// parent's by capability.Delegate, written with the index entries Delegate
// writes, a thousand grants per Update. A child's spawns run one after
// another (on etcd, concurrent spawns under one parent conflict on its
// child count), the children's subtrees concurrently. progress is called
// every ten seconds.
// rootWithGrant registers a root agent named name and issues it a root
// grant of scopes for ttl: the agent's node, and the grant with its token.
func rootWithGrant(ctx context.Context, srv *benchServer, name string, ttl time.Duration, scopes ...string) (*tetherv1.Node, *tetherv1.IssueRootResponse, error) {
	agent, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name}))
	if err != nil {
		return nil, nil, err
	}
	grant, err := srv.Admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: agent.Msg.Node.NodeId, Scopes: scopes, Ttl: durationpb.New(ttl),
	}))
	if err != nil {
		return nil, nil, err
	}
	return agent.Msg.Node, grant.Msg, nil
}

func buildWideTree(ctx context.Context, srv *benchServer, root *tetherv1.Node, rootGrant *tetherv1.Grant, top, per int, progress func(done int)) (wideTree, error) {
	agents := &tree.Tree{Store: srv.Store(), Clock: clock.Real{}, Limits: tree.DefaultLimits, Instance: "bench"}
	now := time.Now().UTC()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fail := func(err error) { cancel(err) }
	var done atomic.Int64
	done.Add(1)

	// Grant writers: batches of a thousand, two Updates in flight.
	grants := make(chan capability.Grant, 4096)
	var writers sync.WaitGroup
	for range 2 {
		writers.Go(func() {
			batch := make([]capability.Grant, 0, 1000)
			flush := func() {
				if len(batch) == 0 {
					return
				}
				err := srv.Store().Update(ctx, func(tx store.Txn) error {
					for _, g := range batch {
						if err := grantstore.PutNewGrantIn(tx, g); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					fail(fmt.Errorf("write grants: %w", err))
				}
				batch = batch[:0]
			}
			for g := range grants {
				batch = append(batch, g)
				if len(batch) == cap(batch) {
					flush()
				}
			}
			flush()
		})
	}
	stopProgress := make(chan struct{})
	var progressDone sync.WaitGroup
	progressDone.Go(func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				progress(int(done.Load()))
			case <-stopProgress:
				return
			}
		}
	})
	finish := func() error {
		close(grants)
		writers.Wait()
		close(stopProgress)
		progressDone.Wait()
		if err := context.Cause(ctx); err != nil {
			return err
		}
		return nil
	}

	spawn := func(parentID string, parentGrant capability.Grant, scopes ...string) (*tree.Node, capability.Grant, error) {
		child, err := agents.Spawn(ctx, parentID, "agent", nil, "bench", nil)
		if err != nil {
			return nil, capability.Grant{}, fmt.Errorf("spawn under %s: %w", parentID, err)
		}
		g, err := capability.Delegate(parentGrant, capability.DelegateRequest{
			GrantID: id.New(id.Grant), Issuer: capability.AgentPrincipal(parentID), HolderNodeID: child.NodeID, Scopes: scopes,
		}, child.Ancestors, now)
		if err != nil {
			return nil, capability.Grant{}, err
		}
		select {
		case grants <- g:
		case <-ctx.Done():
			return nil, capability.Grant{}, context.Cause(ctx)
		}
		done.Add(1)
		return child, g, nil
	}

	type branch struct {
		node  string
		grant capability.Grant
	}
	rootG := wire.GrantFromProto(rootGrant)
	children := make([]branch, top)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < top && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				n, g, err := spawn(root.NodeId, rootG, "tool:shell", "tool:fs:*")
				if err != nil {
					fail(err)
					return
				}
				children[i] = branch{n.NodeID, g}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return wideTree{}, finish()
	}

	out := wideTree{root: root.NodeId, sample: make([]string, top)}
	var leaf atomic.Value
	next.Store(0)
	for range min(top, 128) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < top && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				for j := range per {
					n, g, err := spawn(children[i].node, children[i].grant, "tool:shell")
					if err != nil {
						fail(err)
						return
					}
					if j == 0 {
						out.sample[i] = n.NodeID
						leaf.Store(g.GrantID)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := finish(); err != nil {
		return wideTree{}, err
	}
	out.leafGrant, _ = leaf.Load().(string)
	return out, nil
}
