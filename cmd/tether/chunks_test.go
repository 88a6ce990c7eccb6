package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// chunkedAgents is the subtree of the kill -9 tests: far more nodes than a
// chunk (8), and on etcd with its default limits (128 operations per
// transaction) far more than one transaction can hold.
const chunkedAgents = 300

// TestAChunkedTerminationSurvivesKill9 terminates a subtree much larger
// than one transaction of the termination (and, on etcd started with
// etcd's default limits, than one etcd transaction) with the real binary,
// kills it with SIGKILL after a chunk of the mark, of the revocation or of
// the record has committed, restarts it on the same data, and checks that
// the termination finishes with one record that lists every node of the
// subtree exactly once, each terminated, and every grant and privilege its
// agents held exactly once, revoked (the revocation lists them chunk by
// chunk in its held index, and the record reads them there).
func TestAChunkedTerminationSurvivesKill9(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	for _, backend := range []string{"badger", "etcd"} {
		for _, point := range []string{"mark:6", "revoke:5", "record:7"} {
			t.Run(backend+"/"+point, func(t *testing.T) {
				var args []string
				if backend == "etcd" {
					// etcd's own defaults: --max-txn-ops=128, 1.5 MiB a request.
					cluster := etcdtest.StartWithFlags(t, []string{})
					args = []string{"--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","), "--etcd-prefix", etcdtest.Prefix(t)}
				}
				killMidTermination(t, append(args, "--termination-chunk", "8", "--rate-limit", "0", "--privilege-hook-allow", "127.0.0.1", "--privilege-hook-timeout", "1m"), point)
			})
		}
	}
}

func killMidTermination(t *testing.T, args []string, point string) {
	ctx := context.Background()
	dir, addr := t.TempDir(), testserver.FreeAddr(t)
	proc := testserver.StartProcessOn(t, dir, addr, args...)
	admin := proc.Clients(proc.Admin)
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{root.Msg.Node.NodeId: true}
	parents := []string{root.Msg.Node.NodeId}
	for i := 0; len(want) <= chunkedAgents; i++ {
		resp, err := admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parents[i/6], Name: fmt.Sprintf("agent-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		want[resp.Msg.Node.NodeId] = true
		parents = append(parents, resp.Msg.Node.NodeId)
	}
	// Some agents hold a grant, some a privilege whose webhook answers at
	// once: every one of them must be in the record once, revoked.
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(hook.Close)
	held := map[string]string{} // grant or privilege id → node
	i := 0
	for node := range want {
		i++
		switch {
		case i%7 == 0:
			g, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: node, Scopes: []string{"tool:read"}, Ttl: durationpb.New(time.Hour)}))
			if err != nil {
				t.Fatal(err)
			}
			held[g.Msg.Grant.GrantId] = node
		case i%11 == 0:
			p, err := admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
				NodeId: node, Kind: "file_lock", ExternalId: "lock-" + node, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour)), RevokeUrl: hook.URL + "/revoke",
			}))
			if err != nil {
				t.Fatal(err)
			}
			held[p.Msg.PrivilegeId] = node
		}
	}
	// Restart with the crash point set, so the spawns above were not cut.
	proc.Kill()
	t.Setenv(crashTerminationEnv, point)
	proc = testserver.StartProcessOn(t, dir, addr, args...)
	admin = proc.Clients(proc.Admin)
	term, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: root.Msg.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0), Reason: "kill -9 in the middle",
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	select {
	case <-proc.Exited():
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not reach the crash point %s", point)
	}
	t.Setenv(crashTerminationEnv, "")
	proc = testserver.StartProcessOn(t, dir, addr, args...)
	admin = proc.Clients(proc.Admin)
	var rec *tetherv1.ReconciliationRecord
	testserver.WaitFor(t, 2*time.Minute, "the termination to finish after the restart", func() bool {
		resp, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: id}))
		if err != nil {
			return false
		}
		rec = resp.Msg.Record
		return true
	})
	seen := map[string]int{}
	for _, n := range rec.Nodes {
		seen[n.NodeId]++
		if !want[n.NodeId] {
			t.Fatalf("the record lists %s, which is not in the subtree", n.NodeId)
		}
	}
	for n := range want {
		if seen[n] != 1 {
			t.Fatalf("node %s is in the record %d times, want once", n, seen[n])
		}
	}
	listed := map[string]int{}
	for _, p := range rec.Privileges {
		listed[p.PrivilegeId]++
		if held[p.PrivilegeId] != p.NodeId {
			t.Fatalf("the record lists %s %s of %s, which the subtree's agents were not given", p.Kind, p.PrivilegeId, p.NodeId)
		}
		if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
			t.Fatalf("%s %s of %s is %s in the record, want revoked (%s)", p.Kind, p.PrivilegeId, p.NodeId, p.Outcome, p.Error)
		}
	}
	for h, node := range held {
		if listed[h] != 1 {
			t.Fatalf("%s of %s is in the record %d times, want once", h, node, listed[h])
		}
	}
	nodes, err := admin.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Msg.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Msg.Nodes) != len(want) {
		t.Fatalf("the subtree lists %d nodes, want %d", len(nodes.Msg.Nodes), len(want))
	}
	for _, n := range nodes.Msg.Nodes {
		if n.State != tetherv1.NodeState_NODE_STATE_TERMINATED || n.TerminationId != id {
			t.Fatalf("node %s is %s under %q after the restart", n.NodeId, n.State, n.TerminationId)
		}
	}
	got, err := admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Termination.State != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED || got.Msg.Termination.RecordId != rec.RecordId {
		t.Fatalf("termination %s with record %q, want terminated with %s", got.Msg.Termination.State, got.Msg.Termination.RecordId, rec.RecordId)
	}
}
