package controlplane_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-sixth hostile pass on the capability tree.

// tcpProxy forwards TCP connections to a target it can change (closing the
// connections it carries, so that their clients dial again) and can hold
// every byte in both directions (freeze) until thawed: a replica behind
// one, as its store's client, hears nothing of its store meanwhile, as a
// replica whose watch lags does.
type tcpProxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	conns  map[net.Conn]bool
	thaw   chan struct{} // nil while not frozen; closed at thaw
	closed bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target, closed := p.target, p.closed
		p.mu.Unlock()
		if closed {
			in.Close()
			return
		}
		out, err := net.Dial("tcp", target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies from src to dst, holding each chunk while frozen.
func (p *tcpProxy) pipe(src, dst net.Conn) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thaw := p.thaw
			p.mu.Unlock()
			if thaw != nil {
				<-thaw
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw == nil {
		p.thaw = make(chan struct{})
	}
}

func (p *tcpProxy) unfreeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw != nil {
		close(p.thaw)
		p.thaw = nil
	}
}

// retarget sends new connections to target and closes those carried.
func (p *tcpProxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *tcpProxy) close() {
	p.unfreeze()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.retarget("")
}

// TestRogue26AVerifierKeepsARevocationItAppliedWhenItsFeedMovesToALaggingReplica:
// a verifier follows the feed through a load balancer in front of two
// replicas on one etcd. It has applied a revocation from replica A when its
// stream moves to replica B, whose watch has not delivered it yet. B used
// to answer the verifier's position, ahead of its own feed, with a
// snapshot of what it had (a store restored from a backup looks the same),
// and the verifier replaced its tombstone set with it: the revoked token
// verified again until B's watch caught up — for as long as the rogue's
// revocation sat behind B's lag. A replica behind a position its store has
// reached now waits for its feed to get there; meanwhile the verifier
// hears nothing and fails closed.
func TestRogue26AVerifierKeepsARevocationItAppliedWhenItsFeedMovesToALaggingReplica(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	stA := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	a := testserver.Start(t, testserver.WithEtcdStore(stA, "replica-a"), fastHeartbeat)
	toEtcd := newTCPProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	stB := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) {
		o.Prefix, o.Endpoints = prefix, []string{"http://" + toEtcd.addr()}
	})
	b := testserver.Start(t, testserver.WithEtcdStore(stB, "replica-b"), fastHeartbeat)

	admin := a.AdminClients()
	root := register(t, admin, "root")
	rc := a.Clients(root.Credential)
	child := spawn(t, rc, root.Node.NodeId, "child")
	gRoot := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	gChild := delegate(t, rc, gRoot, child.Node.NodeId, "tool:shell")

	// The verifier reaches the replicas through the balancer, at A first.
	balancer := newTCPProxy(t, strings.TrimPrefix(a.URL, "http://"))
	v, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{
		Conn:            agentsdk.Dial("http://"+balancer.addr(), a.Admin, agentsdk.WithHTTPClient(testserver.H2CClient())),
		StalenessBudget: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("verifier: %v", err)
		}
	})
	testserver.WaitFor(t, 20*time.Second, "the verifier to accept the child's token", func() bool {
		_, err := v.Verify(ctx, gChild.token)
		return err == nil
	})

	// B hears nothing of etcd from here on; the parent revokes through A.
	toEtcd.freeze()
	revoked, err := revokeGrant(rc, gChild.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	seq := revoked.Sequence
	testserver.WaitFor(t, 20*time.Second, "the verifier to apply the revocation from A", func() bool {
		_, err := v.Verify(ctx, gChild.token)
		return v.Head() >= seq && errors.Is(err, capability.ErrGrantRevoked)
	})

	// The balancer moves the verifier's stream to B.
	balancer.retarget(strings.TrimPrefix(b.URL, "http://"))
	testserver.WaitFor(t, 20*time.Second, "the verifier to hear from B or to fail closed", func() bool {
		return v.Head() < seq || v.Fresh() != nil
	})
	if _, err := v.Verify(ctx, gChild.token); err == nil {
		t.Fatalf("the verifier accepts the child's token again after it applied its revocation (sequence %d): its feed moved to a replica behind it, and its head went back to %d", seq, v.Head())
	}
	if h := v.Head(); h < seq {
		t.Errorf("the verifier's head went back from %d to %d", seq, h)
	}

	// Once B catches up the verifier is fresh again, the token still revoked.
	toEtcd.unfreeze()
	testserver.WaitFor(t, 30*time.Second, "the verifier to follow B", func() bool {
		return v.Fresh() == nil && v.Head() >= seq
	})
	if _, err := v.Verify(ctx, gChild.token); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("after B caught up the child's token verifies as %v, want revoked", err)
	}
	// A position the store itself never reached (a restored store) is
	// still answered with a snapshot at once.
	if m := firstFeedMessage(t, b.AdminClients(), seq+100); !m.Snapshot || m.HeadSequence != seq {
		t.Fatalf("a follower ahead of the store: snapshot %v, head %d; want a snapshot at %d", m.Snapshot, m.HeadSequence, seq)
	}
}

// TestRogue26AnAgentIntrospectingATokenOutsideItsSubtreeGetsTheVerdict:
// Introspect answers any reader whether a token is active, and includes
// the stored grant only when the caller may read it. An agent shown a
// token held outside its subtree (a sibling's, another tree's, as a tool
// it runs would be) was refused `not_found` for a live one, while a
// revoked one was answered: the refusal told the two apart and withheld the
// verdict. Both are now answered, without the grant.
func TestRogue26AnAgentIntrospectingATokenOutsideItsSubtreeGetsTheVerdict(t *testing.T) {
	w := newCapWorld(t)
	for what, token := range map[string]string{"its sibling's": w.gChild.token, "another tree's": w.gUnrelated.token} {
		in, err := w.sibling.c.Capability.Introspect(context.Background(), connect.NewRequest(&tetherv1.IntrospectRequest{Token: token}))
		if err != nil {
			t.Errorf("introspecting %s live token: %v", what, err)
			continue
		}
		if !in.Msg.Active || in.Msg.Grant != nil {
			t.Errorf("%s live token: active %v, grant %v; want active without the grant", what, in.Msg.Active, in.Msg.Grant)
		}
	}
	if _, err := revokeGrant(w.parent.c, w.gChild.grant.GrantId); err != nil {
		t.Fatal(err)
	}
	in, err := w.sibling.c.Capability.Introspect(context.Background(), connect.NewRequest(&tetherv1.IntrospectRequest{Token: w.gChild.token}))
	if err != nil {
		t.Fatalf("introspecting its sibling's revoked token: %v", err)
	}
	if in.Msg.Active || in.Msg.Grant != nil {
		t.Errorf("its sibling's revoked token: active %v, grant %v; want inactive without the grant", in.Msg.Active, in.Msg.Grant)
	}
	// Its own subtree's token still comes with its grant.
	if in := introspect(t, w.parent.c, w.gSibling.token); !in.Active || in.Grant.GetGrantId() != w.gSibling.grant.GrantId {
		t.Errorf("the parent introspecting its child's token: active %v, grant %v", in.Active, in.Grant)
	}
}

// TestRogue26AnAgentsFeedDoesNotNameNodesOutsideItsSubtree: an agent's
// revocation feed carries its lineage's tombstones (a verifier of the
// lineage's tokens needs their grant ids), but named the node holding each
// revoked grant: a rogue learned its siblings' and cousins' node ids, and
// when each was stopped (a termination revokes what the node holds), though
// GetNode answers it that such a node does not exist. The holder is now
// named only to the holder itself and to the agents below it, whom the
// revocation affects (as the reason is).
func TestRogue26AnAgentsFeedDoesNotNameNodesOutsideItsSubtree(t *testing.T) {
	w := newCapWorld(t)
	ctx := context.Background()
	if _, err := w.sibling.c.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.child.id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the rogue's GetNode of its sibling: %v, want not_found", err)
	}
	revoked, err := revokeGrant(w.parent.c, w.gChild.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	// holders returns grant → holder as a caller's feed shows them.
	holders := func(c *testserver.Clients) map[string]string {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]string{}
		for stream.Receive() {
			for _, ts := range stream.Msg().Tombstones {
				seen[ts.GrantId] = ts.HolderNodeId
			}
			if stream.Msg().HeadSequence >= revoked.Sequence {
				return seen
			}
		}
		t.Fatalf("the feed ended: %v", stream.Err())
		return nil
	}
	if got := holders(w.sibling.c); got[w.gChild.grant.GrantId] != "" {
		t.Errorf("the rogue's feed names its sibling %s as the holder of the revoked grant %s (GetNode tells it no such node exists)", got[w.gChild.grant.GrantId], w.gChild.grant.GrantId)
	}
	for name, c := range map[string]*testserver.Clients{"the holder": w.child.c, "its descendant": w.descendant.c, "an operator": w.admin} {
		if got := holders(c); got[w.gChild.grant.GrantId] != w.child.id {
			t.Errorf("%s's feed names %q as the holder of %s, want %s", name, got[w.gChild.grant.GrantId], w.gChild.grant.GrantId, w.child.id)
		}
	}
}

// TestRogue26ACallCannotBeginOnAGrantRevokedAfterItsTokenWasChecked: a
// gate's BeginCall checks the caller's token (its grant and whole chain,
// in the store) and then begins the call in a transaction of its own. A
// revocation acknowledged between the two did not stop the call: the
// rogue's call began, in flight, on a grant its parent had revoked and
// been told was revoked. The call's transaction now reads the grant and
// its chain again, so a revocation either commits first and the call is
// refused, or commits after a call begun before it.
func TestRogue26ACallCannotBeginOnAGrantRevokedAfterItsTokenWasChecked(t *testing.T) {
	var (
		mu      sync.Mutex
		armed   bool
		reached = make(chan struct{})
		resume  = make(chan struct{})
	)
	srv := testserver.Start(t, func(cfg *controlplane.Config) {
		cfg.LedgerFault = func(point string) {
			mu.Lock()
			hold := armed && point == "token-checked"
			armed = armed && !hold
			mu.Unlock()
			if hold {
				close(reached)
				<-resume
			}
		}
	})
	var once sync.Once
	release := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(release)
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	rc := srv.Clients(root.Credential)
	rogue := spawn(t, rc, root.Node.NodeId, "rogue")
	gRoot := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
	gRogue := delegate(t, rc, gRoot, rogue.Node.NodeId, "tool:shell")
	gate := srv.Clients(srv.ToolServerToken(t, "gate"))

	mu.Lock()
	armed = true
	mu.Unlock()
	type begun struct {
		call *tetherv1.ToolCall
		err  error
	}
	result := make(chan begun, 1)
	go func() {
		resp, err := gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: gRogue.token, Tool: "shell"}))
		if err != nil {
			result <- begun{err: err}
			return
		}
		result <- begun{call: resp.Msg.Call}
	}()
	select {
	case <-reached:
	case r := <-result:
		t.Fatalf("the call was answered before its token was checked: %v %v", r.call, r.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the gate's call never reached the ledger")
	}
	revoked, err := revokeGrant(rc, gRogue.grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	release()
	var r begun
	select {
	case r = <-result:
	case <-time.After(20 * time.Second):
		t.Fatal("the gate's call never ended")
	}
	if r.err == nil {
		t.Fatalf("call %s began (%s) on grant %s after its revocation was acknowledged (sequence %d)", r.call.CallId, r.call.State, gRogue.grant.GrantId, revoked.Sequence)
	}
	if connect.CodeOf(r.err) != connect.CodePermissionDenied || !strings.Contains(r.err.Error(), "revoked") {
		t.Fatalf("the call was refused with %v, want permission_denied: grant revoked", r.err)
	}
	// The gate's next call with the token is refused as before.
	if _, err := gate.Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: gRogue.token, Tool: "shell"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("the next call: %v, want permission_denied", err)
	}
}
