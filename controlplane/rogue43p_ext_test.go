package controlplane_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Forty-third hostile pass (letter P): large subtrees, and spawning
// during a stop.

// rogue43PNode is a node of the rogue's swarm with its credential and a
// capability token of its own root grant.
type rogue43PNode struct {
	id, cred, token string
	// exits: it claims its own exit mid-flood; claims: it claims its last
	// child's (lastChild).
	exits, claims bool
	lastChild     string
}

// TestRogue43PASwarmSpawningThroughItsChunkedAbortAndAKill9IsRecordedOnce:
// a rogue swarm (a root, 6 children, 36 grandchildren, each with a root
// grant of its own) spawns, one by one and in batches, from every node as
// fast as its budget allows, delegates its grants to the children it
// spawned and claims its own and its children's exits, while an operator's
// abort marks it two nodes a chunk; the server is killed (-9) mid-mark and
// again once the subtree is revoked, each time restarted on the same
// Badger directory. Every node the tree holds under the root — the swarm
// and every child a spawn or batch got through — is listed exactly once in
// the record, is terminated, and holds no live token (its own, or one
// delegated to it during the stop); no spawn is served after. (A probe of
// the forty-third pass: it passed on main.)
func TestRogue43PASwarmSpawningThroughItsChunkedAbortAndAKill9IsRecordedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir, "--termination-chunk", "2")
	admin := proc.Clients(proc.Admin)
	ctx := context.Background()
	root := register(t, admin, "rogue")
	grants := map[string]string{} // node → its root grant's id
	grant := func(c *testserver.Clients, node string) string {
		issued, err := c.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		grants[node] = issued.Msg.Grant.GrantId
		return issued.Msg.Token
	}
	swarm := []rogue43PNode{{id: root.Node.NodeId, cred: root.Credential, token: grant(admin, root.Node.NodeId)}}
	batch := func(parent rogue43PNode, n int, prefix string) []*tetherv1.SpawnResponse {
		children := make([]*tetherv1.SpawnBatchChild, n)
		for i := range children {
			children[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("%s-%d", prefix, i)}
		}
		resp, err := proc.Clients(parent.cred).Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: parent.id, Children: children}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Spawned
	}
	for _, c := range batch(swarm[0], 6, "child") {
		child := rogue43PNode{id: c.Node.NodeId, cred: c.Credential, token: grant(admin, c.Node.NodeId)}
		swarm = append(swarm, child)
		for _, g := range batch(child, 6, "grandchild") {
			swarm = append(swarm, rogue43PNode{id: g.Node.NodeId, cred: g.Credential, token: grant(admin, g.Node.NodeId)})
		}
	}

	// Every node spawns until a spawn is refused as a stopping node's
	// (failed_precondition), and each child it got through spawns too.
	var mu sync.Mutex
	spawned := map[string]bool{}
	codes := map[string]int{}
	var delegated []string // tokens each swarm node delegated to a child it spawned in the flood
	var wg sync.WaitGroup
	var run func(n rogue43PNode, depth int)
	var first sync.WaitGroup
	run = func(n rogue43PNode, depth int) {
		defer wg.Done()
		c := proc.Clients(n.cred)
		firstDone := depth > 0
		defer func() {
			if !firstDone {
				first.Done()
			}
		}()
		for i := range 24 {
			if i == 4 && n.exits {
				_, err := c.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: n.id, Reason: "done"}))
				mu.Lock()
				codes["own exit: "+connect.CodeOf(err).String()]++
				mu.Unlock()
			}
			if n.token != "" && n.lastChild != "" && i%2 == 1 {
				// Its grant delegated to its newest child, as the stop comes.
				resp, err := c.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: grants[n.id], HolderNodeId: n.lastChild, Scopes: []string{"tool:x"}}))
				mu.Lock()
				codes["delegate: "+connect.CodeOf(err).String()]++
				if err == nil {
					delegated = append(delegated, resp.Msg.Token)
				}
				mu.Unlock()
			}
			if i == 2 && n.claims && n.lastChild != "" {
				_, err := c.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: n.lastChild, Reason: "it finished"}))
				mu.Lock()
				codes["child's exit: "+connect.CodeOf(err).String()]++
				mu.Unlock()
			}
			if i == 5 && !firstDone {
				firstDone = true
				first.Done()
			}
			var got []*tetherv1.SpawnResponse
			var err error
			if i%2 == 0 {
				var resp *connect.Response[tetherv1.SpawnResponse]
				resp, err = c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: n.id, Name: fmt.Sprintf("late-%d", i)}))
				if err == nil {
					got = []*tetherv1.SpawnResponse{resp.Msg}
				}
			} else {
				var resp *connect.Response[tetherv1.SpawnBatchResponse]
				resp, err = c.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: n.id, Children: []*tetherv1.SpawnBatchChild{{Name: fmt.Sprintf("late-a-%d", i)}, {Name: fmt.Sprintf("late-b-%d", i)}}}))
				if err == nil {
					got = resp.Msg.Spawned
				}
			}
			if err != nil {
				switch connect.CodeOf(err) {
				case connect.CodeResourceExhausted:
					continue
				}
				mu.Lock()
				codes["spawn: "+connect.CodeOf(err).String()]++
				mu.Unlock()
				return // refused as a stopping node's, or the server is gone
			}
			mu.Lock()
			for _, s := range got {
				spawned[s.Node.NodeId] = true
			}
			mu.Unlock()
			n.lastChild = got[len(got)-1].Node.NodeId
			if depth < 1 {
				for _, s := range got {
					wg.Add(1)
					go run(rogue43PNode{id: s.Node.NodeId, cred: s.Credential, exits: depth == 0 && s.Node.NodeId[len(s.Node.NodeId)-1]%2 == 0}, depth+1)
				}
			}
		}
	}
	for i, n := range swarm {
		n.exits, n.claims = i%3 == 2, i%5 == 4
		wg.Add(1)
		first.Add(1)
		go run(n, 0)
	}
	first.Wait() // every node has spawned once: the stop comes mid-flood
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, time.Second, time.Second, time.Second)
	wg.Wait() // every spawner refused: the kill comes mid-termination
	killedAt := getTermination(t, admin, term.TerminationId)
	proc.Kill()

	again := testserver.StartProcess(t, dir, "--termination-chunk", "2")
	admin = again.Clients(again.Admin)
	// A second kill once the subtree is revoked (confirming, or writing
	// the record in chunks; or done, on a fast machine), and a second
	// restart.
	var second tetherv1.TerminationState
	testserver.WaitFor(t, 60*time.Second, "the revocation to end after the restart", func() bool {
		second = getTermination(t, admin, term.TerminationId).State
		return second != tetherv1.TerminationState_TERMINATION_STATE_REQUESTED && second != tetherv1.TerminationState_TERMINATION_STATE_ABORTING
	})
	again.Kill()
	t.Logf("killed again at %s", second)
	again = testserver.StartProcess(t, dir, "--termination-chunk", "2")
	admin = again.Clients(again.Admin)
	testserver.WaitFor(t, 60*time.Second, "the termination to complete after the restart", func() bool {
		return getTermination(t, admin, term.TerminationId).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})

	// The record's nodes, every page.
	listed := map[string]int{}
	req := &tetherv1.GetRecordRequest{TerminationId: term.TerminationId}
	for {
		resp, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.Msg.Record.Nodes {
			listed[n.NodeId]++
		}
		if resp.Msg.NextPageToken == "" {
			break
		}
		req = &tetherv1.GetRecordRequest{TerminationId: term.TerminationId, PageToken: resp.Msg.NextPageToken}
	}
	// The tree's nodes under the root, every page.
	inTree := map[string]*tetherv1.Node{}
	lreq := &tetherv1.ListNodesRequest{RootNodeId: root.Node.NodeId}
	for {
		resp, err := admin.Agent.ListNodes(ctx, connect.NewRequest(lreq))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.Msg.Nodes {
			inTree[n.NodeId] = n
		}
		if resp.Msg.NextPageToken == "" {
			break
		}
		lreq = &tetherv1.ListNodesRequest{RootNodeId: root.Node.NodeId, PageToken: resp.Msg.NextPageToken}
	}
	t.Logf("killed at %s (%d nodes marked); answers: %v", killedAt.State, killedAt.GetProgress().GetNodesMarked(), codes)
	t.Logf("swarm %d, spawned through the stop %d, in the tree %d, in the record %d", len(swarm), len(spawned), len(inTree), len(listed))
	var faults []string
	for id, n := range inTree {
		if listed[id] != 1 {
			faults = append(faults, fmt.Sprintf("node %s (%s) is listed %d times in the record", id, n.Name, listed[id]))
		}
		if n.State != tetherv1.NodeState_NODE_STATE_TERMINATED {
			faults = append(faults, fmt.Sprintf("node %s (%s) is %s after the termination", id, n.Name, n.State))
		}
	}
	for id := range listed {
		if inTree[id] == nil {
			faults = append(faults, fmt.Sprintf("the record lists %s, which the tree does not hold under the root", id))
		}
	}
	for id := range spawned {
		if inTree[id] == nil {
			faults = append(faults, fmt.Sprintf("spawned node %s is not in the tree", id))
		}
	}
	for _, f := range faults {
		t.Error(f)
	}
	for _, tok := range delegated {
		resp, err := admin.Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{Token: tok}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Active {
			t.Errorf("a token delegated during the stop is still active after it: %s", resp.Msg.Reason)
		}
	}
	// No token of the swarm is active, and no spawn is served.
	for _, n := range swarm {
		resp, err := admin.Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{Token: n.token}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Active {
			t.Errorf("node %s's token is still active after its termination", n.id)
		}
		_, err = again.Clients(n.cred).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: n.id, Name: "after"}))
		if err == nil {
			t.Errorf("node %s spawned after its termination", n.id)
		}
	}
}
