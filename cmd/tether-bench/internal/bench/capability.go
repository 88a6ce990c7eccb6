package bench

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

func init() {
	Register("capability/revoke-subtree", onServer(capabilityRevokeSubtree))
	Register("capability/verify", onServer(capabilityVerify))
	Register("capability/durable", onServer(capabilityDurable))
}

// capabilityRevokeSubtree revokes the root of subtrees of 1,000, 10,000
// and 100,000 descendant grants through the real server and measures the
// time from the Revoke call until an offline verifier following the
// revocation feed rejects a leaf's token: the revocation round trip, one
// tombstone through the feed. It should be flat in the subtree's size.
// Also reported: the Revoke RPC alone, and how long the background marker
// then takes to rewrite the subtree's stored states (not on any request
// path). The trees are written straight into the store in big batches, as
// Delegate would write them; a leaf's token comes from a real Refresh.
func capabilityRevokeSubtree(ctx context.Context, r *Report, srv *benchServer) error {
	verifier, stopVerifier, err := startBenchVerifier(ctx, srv, -1)
	if err != nil {
		return err
	}
	defer stopVerifier()
	line, err := registerLine(ctx, srv, 3)
	if err != nil {
		return err
	}
	const samples = 3
	for _, size := range []int{1000, 10000, 100000} {
		var roundTrips, rpcs []time.Duration
		var marking time.Duration
		for sample := range samples {
			root, err := issueBenchRoot(ctx, srv, line[0].id)
			if err != nil {
				return err
			}
			leaf, err := writeSubtree(ctx, srv, root, line, size)
			if err != nil {
				return err
			}
			refreshed, err := srv.Admin.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: leaf}))
			if err != nil {
				return err
			}
			token := refreshed.Msg.Token
			if _, err := verifier.Verify(ctx, token); err != nil {
				return fmt.Errorf("the leaf's token before the revocation: %w", err)
			}

			start := time.Now()
			roundTrip, rpc, err := revokeToReject(ctx, srv, verifier, root.GrantId, token)
			if err != nil {
				return err
			}
			roundTrips = append(roundTrips, roundTrip)
			rpcs = append(rpcs, rpc)

			// Let the marker finish before the next sample, so samples do
			// not compete with it; the last sample's time is reported.
			if err := waitForMarker(ctx, srv.Grants(), 5*time.Minute); err != nil {
				return err
			}
			if sample == samples-1 {
				marking = time.Since(start)
			}
		}
		r.Add(fmt.Sprintf("capability/revoke-to-verifier-reject/descendants=%d", size), ms(median(roundTrips)), "ms")
		r.Add(fmt.Sprintf("capability/revoke-rpc/descendants=%d", size), ms(median(rpcs)), "ms")
		r.Add(fmt.Sprintf("capability/marker-background/descendants=%d", size), ms(marking), "ms")
	}
	return nil
}

// revokeToReject revokes grantID (a grant with descendants) through the
// server as the admin and measures the time from the call until verifier
// rejects token, a descendant's token it accepted before: the revocation
// round trip. rpc is the Revoke call alone. The revocation must write one
// tombstone, whatever the number of descendants.
func revokeToReject(ctx context.Context, srv *benchServer, verifier *agentsdk.Verifier, grantID, token string) (roundTrip, rpc time.Duration, err error) {
	start := time.Now()
	resp, err := srv.Admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grantID}}))
	if err != nil {
		return 0, 0, err
	}
	rpc = time.Since(start)
	if len(resp.Msg.RevokedGrantIds) != 1 {
		return 0, 0, fmt.Errorf("revoking a grant with descendants wrote %d tombstones, want 1", len(resp.Msg.RevokedGrantIds))
	}
	for {
		_, err := verifier.Verify(ctx, token)
		if errors.Is(err, capability.ErrGrantRevoked) {
			return time.Since(start), rpc, nil
		}
		if err != nil {
			return 0, 0, fmt.Errorf("waiting for the descendant's token to be rejected: %w", err)
		}
		if time.Since(start) > 30*time.Second {
			return 0, 0, errors.New("the verifier never rejected the descendant's token")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// waitForMarker waits until the revocation marker has no job left, at
// most within.
func waitForMarker(ctx context.Context, grants *grantstore.Service, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n, err := grants.PendingMarks(ctx)
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the marker still has %d jobs after %v", n, within)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// benchAgent is a registered node and a connection with its credential.
type benchAgent struct {
	id        string
	ancestors []string
	conn      *agentsdk.Conn
}

// registerLine registers a root agent and a line of n-1 descendants, each
// spawned by its parent.
func registerLine(ctx context.Context, srv *benchServer, n int) ([]benchAgent, error) {
	resp, err := srv.Admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "bench-root"}))
	if err != nil {
		return nil, err
	}
	line := []benchAgent{{id: resp.Msg.Node.NodeId, conn: agentsdk.Dial(srv.URL, resp.Msg.Credential)}}
	for i := 1; i < n; i++ {
		parent := line[i-1]
		child, err := parent.conn.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent.id, Name: fmt.Sprintf("bench-%d", i)}))
		if err != nil {
			return nil, err
		}
		line = append(line, benchAgent{id: child.Msg.Node.NodeId, ancestors: child.Msg.Node.Ancestors, conn: agentsdk.Dial(srv.URL, child.Msg.Credential)})
	}
	return line, nil
}

func issueBenchRoot(ctx context.Context, srv *benchServer, holder string) (*tetherv1.Grant, error) {
	resp, err := srv.Admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: holder, Scopes: []string{"tool:*", "s3:read:logs/*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Grant, nil
}

// writeSubtree writes size descendants below root, as Delegate would:
// a hundred children held by line[1], each with (size-100)/100 children
// held by line[2], in transactions of a thousand grants. It returns a
// leaf's grant id.
func writeSubtree(ctx context.Context, srv *benchServer, rootProto *tetherv1.Grant, line []benchAgent, size int) (string, error) {
	const children = 100
	perChild := (size - children) / children
	if children+children*perChild != size {
		return "", fmt.Errorf("a subtree of %d does not split into %d children", size, children)
	}
	root := wire.GrantFromProto(rootProto)
	now := time.Now().UTC()
	agents := &tree.Tree{Store: srv.Store()} // notes each grant's holder
	var batch []capability.Grant
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := srv.Store().Update(ctx, func(tx store.Txn) error {
			for _, g := range batch {
				if err := grantstore.PutNewGrantIn(tx, agents, g); err != nil {
					return err
				}
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	derive := func(parent capability.Grant, holder benchAgent, scopes ...string) (capability.Grant, error) {
		return capability.Delegate(parent, capability.DelegateRequest{
			GrantID: id.New(id.Grant), Issuer: capability.AgentPrincipal(parent.HolderNodeID), HolderNodeID: holder.id, Scopes: scopes,
		}, holder.ancestors, now)
	}
	leaf := ""
	for range children {
		child, err := derive(root, line[1], "tool:shell", "tool:fs:*")
		if err != nil {
			return "", err
		}
		batch = append(batch, child)
		for range perChild {
			grandchild, err := derive(child, line[2], "tool:shell")
			if err != nil {
				return "", err
			}
			batch = append(batch, grandchild)
			leaf = grandchild.GrantID
			if len(batch) == 1000 {
				if err := flush(); err != nil {
					return "", err
				}
			}
		}
	}
	return leaf, flush()
}

// startBenchVerifier runs an agentsdk Verifier on the server's feed (with
// a viewer token) and waits for it to be ready. cacheSize is passed on:
// negative disables the cache.
func startBenchVerifier(ctx context.Context, srv *benchServer, cacheSize int) (*agentsdk.Verifier, func(), error) {
	viewer, err := srv.Admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_VIEWER, Ttl: durationpb.New(time.Hour), Subject: "bench-verifier"}))
	if err != nil {
		return nil, nil, err
	}
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: agentsdk.Dial(srv.URL, viewer.Msg.Token), CacheSize: cacheSize})
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = v.Run(runCtx); close(done) }()
	stop := func() { cancel(); <-done }
	select {
	case <-v.Ready():
		return v, stop, nil
	case <-time.After(10 * time.Second):
		stop()
		return nil, nil, errors.New("the verifier never received the revocation feed")
	}
}

// capabilityVerify measures offline verification throughput on all cores:
// raw crypto/ed25519 Verify of a token's signature (the floor), the
// agentsdk Verifier with its cache disabled (every token's signature and
// claims checked: cold), and with its cache (cached), all with the same
// number of goroutines in the same run. The tokens are real: minted by
// the server for a grant four delegations deep, and the verifier holds a
// thousand live tombstones, so the chain check does real lookups.
func capabilityVerify(ctx context.Context, r *Report, srv *benchServer) error {
	line, err := registerLine(ctx, srv, 5)
	if err != nil {
		return err
	}
	// A thousand revoked grants elsewhere, so the tombstone set is not empty.
	if err := revokeUnrelated(ctx, srv, line[0].id, 1000); err != nil {
		return err
	}
	root, err := issueBenchRoot(ctx, srv, line[0].id)
	if err != nil {
		return err
	}
	parent := root
	var tokens []string
	for i := 1; i < len(line); i++ {
		resp, err := line[i-1].conn.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: parent.GrantId, HolderNodeId: line[i].id, Scopes: []string{"tool:shell"}}))
		if err != nil {
			return err
		}
		parent = resp.Msg.Grant
	}
	// Several tokens for the deepest grant, so that cache hits are spread
	// over distinct keys.
	for range 64 {
		resp, err := srv.Admin.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: parent.GrantId}))
		if err != nil {
			return err
		}
		tokens = append(tokens, resp.Msg.Token)
	}

	workers := runtime.GOMAXPROCS(0)
	dot := strings.LastIndexByte(tokens[0], '.')
	input := []byte(tokens[0][:dot])
	sig, err := base64.RawURLEncoding.DecodeString(tokens[0][dot+1:])
	if err != nil {
		return err
	}
	signer, err := srv.Issuer().Ring().Signer(time.Now())
	if err != nil {
		return err
	}
	coldVerifier, stopCold, err := startBenchVerifier(ctx, srv, -1)
	if err != nil {
		return err
	}
	defer stopCold()
	cachedVerifier, stopCached, err := startBenchVerifier(ctx, srv, 0)
	if err != nil {
		return err
	}
	defer stopCached()
	for _, v := range []*agentsdk.Verifier{coldVerifier, cachedVerifier} {
		if v.Head() < 1000 {
			return fmt.Errorf("a verifier holds tombstones up to %d, want 1000", v.Head())
		}
	}
	ops := map[string]func(context.Context, int) error{
		"raw": func(context.Context, int) error {
			if !ed25519.Verify(signer.Public, input, sig) {
				return errors.New("signature does not verify")
			}
			return nil
		},
	}
	var next atomic.Uint64
	for name, v := range map[string]*agentsdk.Verifier{"cold": coldVerifier, "cached": cachedVerifier} {
		ops[name] = func(ctx context.Context, _ int) error {
			_, err := v.Verify(ctx, tokens[next.Add(1)%uint64(len(tokens))])
			return err
		}
	}
	// The three are measured in short interleaved rounds, so that changes
	// in the machine's load hit them alike; the ratio reported is the
	// median of the rounds' ratios, which one disturbed round cannot move.
	// Beside it, the same ratio per CPU-second of this process, which
	// other processes on the machine do not disturb at all.
	const rounds = 10
	rates := map[string]float64{}
	var ratios []float64
	opsDone, cpuUsed := map[string]float64{}, map[string]time.Duration{}
	cpuOK := true
	for range rounds {
		round := map[string]float64{}
		for _, name := range []string{"raw", "cold", "cached"} {
			var n atomic.Int64
			op := ops[name]
			cpuBefore, ok1 := processCPU()
			rate, err := Throughput(ctx, workers, r.Duration/rounds, func(ctx context.Context, w int) error {
				n.Add(1)
				return op(ctx, w)
			})
			cpuAfter, ok2 := processCPU()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			cpuOK = cpuOK && ok1 && ok2
			opsDone[name] += float64(n.Load())
			cpuUsed[name] += cpuAfter - cpuBefore
			round[name] = rate
			rates[name] += rate / rounds
		}
		ratios = append(ratios, round["cold"]/round["raw"])
	}
	slices.Sort(ratios)
	raw, cold, cached := rates["raw"], rates["cold"], rates["cached"]
	if cpuOK && cpuUsed["raw"] > 0 && cpuUsed["cold"] > 0 {
		perCPU := func(name string) float64 { return opsDone[name] / cpuUsed[name].Seconds() }
		r.Add("capability/verify-cold-to-raw-ratio-per-cpu-second", perCPU("cold")/perCPU("raw"), "ratio")
	}
	r.Add(fmt.Sprintf("capability/verify-raw-ed25519/goroutines=%d", workers), raw, "tokens/s")
	r.Add(fmt.Sprintf("capability/verify-cold/goroutines=%d", workers), cold, "tokens/s")
	r.Add(fmt.Sprintf("capability/verify-cached/goroutines=%d", workers), cached, "tokens/s")
	r.Add("capability/verify-cold-to-raw-ratio", ratios[len(ratios)/2], "ratio")
	return nil
}

// revokeUnrelated writes n root grants for holder straight into the store
// and revokes them all with one bulk revocation: n tombstones.
func revokeUnrelated(ctx context.Context, srv *benchServer, holder string, n int) error {
	now := time.Now().UTC()
	agents := &tree.Tree{Store: srv.Store()} // notes each grant's holder
	err := srv.Store().Update(ctx, func(tx store.Txn) error {
		for range n {
			g, err := capability.NewRoot(capability.RootRequest{GrantID: id.New(id.Grant), Issuer: "operator:bench", HolderNodeID: holder, Scopes: []string{"tool:net"}, TTL: time.Hour}, now)
			if err != nil {
				return err
			}
			if err := grantstore.PutNewGrantIn(tx, agents, g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	resp, err := srv.Admin.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: holder}}))
	if err != nil {
		return err
	}
	if len(resp.Msg.RevokedGrantIds) != n {
		return fmt.Errorf("bulk revocation wrote %d tombstones, want %d", len(resp.Msg.RevokedGrantIds), n)
	}
	return nil
}

// capabilityDurable measures durable Delegate and Revoke throughput
// through the real server with 64 concurrent clients, one connection each:
// every acknowledged call is committed to Badger with SyncWrites.
// Delegations come from one parent grant to the root's children in turn
// (each writes a grant and its index entries and mints a token; a node
// holds at most grantstore.DefaultMaxPerNode live grants delegated by
// agents, so they are spread over durableHolders children); revocations
// revoke those grants one by one, as their parent's holder (each writes
// the grant, a tombstone and the feed head).
// durableHolders is how many nodes capability/durable delegates to: room
// for 512 × 256 live grants, more than its clients make in a run.
const durableHolders = 512

func capabilityDurable(ctx context.Context, r *Report, srv *benchServer) error {
	line, err := registerLine(ctx, srv, 1)
	if err != nil {
		return err
	}
	root, err := issueBenchRoot(ctx, srv, line[0].id)
	if err != nil {
		return err
	}
	holders := make([]string, durableHolders)
	for i := range holders {
		child, err := line[0].conn.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: line[0].id, Name: fmt.Sprintf("holder-%d", i)}))
		if err != nil {
			return err
		}
		holders[i] = child.Msg.Node.NodeId
	}
	var next atomic.Uint64
	const workers = 64
	// Each client has its own connection, as separate agents would.
	clients := make([]*agentsdk.Conn, workers)
	for i := range clients {
		clients[i] = agentsdk.Dial(srv.URL, line[0].conn.Token())
	}
	var (
		mu      sync.Mutex
		created []string
	)
	delegateOnce := func(ctx context.Context, worker int) error {
		resp, err := clients[worker].Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: root.GrantId, HolderNodeId: holders[next.Add(1)%durableHolders], Scopes: []string{"tool:shell"}}))
		if err != nil {
			return err
		}
		mu.Lock()
		created = append(created, resp.Msg.Grant.GrantId)
		mu.Unlock()
		return nil
	}
	delegates, err := Throughput(ctx, workers, r.Duration, delegateOnce)
	if err != nil {
		return err
	}
	r.Add(fmt.Sprintf("capability/durable-delegate/clients=%d", workers), delegates, "ops/s")

	// Revoke every grant just created, each one call.
	ids := make(chan string, len(created))
	for _, id := range created {
		ids <- id
	}
	close(ids)
	var (
		wg       sync.WaitGroup
		firstErr error
		errOnce  sync.Once
	)
	start := time.Now()
	for _, client := range clients {
		wg.Go(func() {
			for grantID := range ids {
				_, err := client.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: grantID}}))
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	r.Add(fmt.Sprintf("capability/durable-revoke/clients=%d", workers), float64(len(created))/elapsed.Seconds(), "ops/s")
	return nil
}
