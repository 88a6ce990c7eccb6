package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAcknowledgedRegistrationsSurviveKill9 registers agents from many
// clients, kills the real server process with SIGKILL while they are in
// flight, restarts it on the same data directory and checks that every
// registration that was acknowledged is there.
func TestAcknowledgedRegistrationsSurviveKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir)
	admin := proc.Clients(proc.Admin)
	root, err := admin.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
	)
	killAt := 150
	killed := make(chan struct{})
	var once sync.Once
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := admin.Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
				if err != nil {
					return // the server is gone
				}
				mu.Lock()
				acked = append(acked, resp.Msg.Node.NodeId)
				n := len(acked)
				mu.Unlock()
				if n == killAt {
					once.Do(func() { proc.Kill(); close(killed) })
				}
			}
		}()
	}
	wg.Wait()
	<-killed
	restarted := testserver.StartProcess(t, dir)
	c := restarted.Clients(restarted.Admin)
	resp, err := c.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Msg.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, n := range resp.Msg.Nodes {
		present[n.NodeId] = true
	}
	for _, id := range acked {
		if !present[id] {
			t.Errorf("acknowledged spawn %s lost after kill -9", id)
		}
	}
	t.Logf("%d acknowledged spawns, %d nodes after restart", len(acked), len(resp.Msg.Nodes)-1)
	if len(acked) < killAt {
		t.Fatalf("only %d spawns acknowledged before the kill", len(acked))
	}
}

// TestStopRuleKill9BetweenFiringAndProposing: the real server kills itself
// with SIGKILL the moment a stop rule is true and its proposal is about to
// be written, and again just after it is written; restarted on the same
// data directory (on Badger; on etcd, the same keyspace), the rule has
// filed exactly one proposal, naming it.
func TestStopRuleKill9BetweenFiringAndProposing(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	for _, run := range []struct{ backend, point string }{{"badger", "before-file"}, {"badger", "after-file"}, {"etcd", "before-file"}, {"etcd", "after-file"}} {
		point := run.point
		t.Run(run.backend+"/"+point, func(t *testing.T) {
			var args []string
			if run.backend == "etcd" {
				args = etcdServeArgs(t)
			}
			ctx := context.Background()
			dir := t.TempDir()
			addr := testserver.FreeAddr(t)
			t.Setenv(crashStopRuleEnv, point)
			proc := testserver.StartProcessOn(t, dir, addr, args...)
			admin := proc.Clients(proc.Admin)
			root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
			if err != nil {
				t.Fatal(err)
			}
			rule, err := admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Msg.Node.NodeId, Name: "one-child", Expression: "observed.spawns >= 1"}))
			if err != nil {
				t.Fatal(err)
			}
			// The spawn makes the rule true; the process may die before it answers.
			_, _ = admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "child"}))
			<-proc.Exited()

			t.Setenv(crashStopRuleEnv, "")
			again := testserver.StartProcessOn(t, dir, addr, args...)
			c := again.Clients(again.Admin)
			var filed []*tetherv1.StopProposal
			// A second rule firing on the restarted server is the sign that its
			// evaluator has looked at the node, with the first rule still true.
			marker, err := c.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Msg.Node.NodeId, Name: "marker", Expression: "observed.subtree_size >= 2"}))
			if err != nil {
				t.Fatal(err)
			}
			testserver.WaitFor(t, 30*time.Second, "both rules to file", func() bool {
				resp, err := c.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
				if err != nil {
					t.Fatal(err)
				}
				filed = resp.Msg.Proposals
				byRule := map[string]int{}
				for _, p := range filed {
					byRule[p.Rule.GetRuleId()]++
				}
				return byRule[rule.Msg.Rule.RuleId] >= 1 && byRule[marker.Msg.Rule.RuleId] >= 1
			})
			n := 0
			for _, p := range filed {
				if p.Rule.GetRuleId() == rule.Msg.Rule.RuleId {
					n++
					if p.Rule.Name != "one-child" || p.NodeId != root.Msg.Node.NodeId {
						t.Fatalf("proposal %v", p)
					}
				}
			}
			if n != 1 {
				t.Fatalf("after kill -9 at %s the rule filed %d proposals, want exactly one", point, n)
			}
		})
	}
}
