package main

import (
	"context"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestAcknowledgedRegistrationsSurviveKill9 registers agents from many
// clients, kills the real server process with SIGKILL while they are in
// flight, restarts it on the same data directory and checks that every
// registration that was acknowledged is there.
func TestAcknowledgedRegistrationsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
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
