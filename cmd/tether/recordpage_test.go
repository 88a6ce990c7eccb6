package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// TestRecordShowFollowsPages has the server answer records in pages of a
// few KB (as it answers a record of 100,000 nodes in pages of a few MiB):
// `tether record show -o json` prints the whole record, every node of the
// subtree exactly once, and `tether record ls` counts them all.
func TestRecordShowFollowsPages(t *testing.T) {
	defer func(b int) { supervisor.RecordPageBytes = b }(supervisor.RecordPageBytes)
	supervisor.RecordPageBytes = 3000
	ctx := context.Background()
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.TerminationChunk = 8 })
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{root.Msg.Node.NodeId: true}
	parents := []string{root.Msg.Node.NodeId}
	for i := 0; len(want) <= 120; i++ {
		resp, err := admin.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parents[i/6], Name: fmt.Sprintf("agent-%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		want[resp.Msg.Node.NodeId] = true
		parents = append(parents, resp.Msg.Node.NodeId)
	}
	term, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: root.Msg.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0), Reason: "pages",
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	var first *connect.Response[tetherv1.GetRecordResponse]
	testserver.WaitFor(t, time.Minute, "the termination's record", func() bool {
		first, err = admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: id}))
		return err == nil
	})
	if first.Msg.NextPageToken == "" || len(first.Msg.Record.Nodes) >= len(want) {
		t.Fatalf("the first answer has %d nodes and no next page: the test does not page", len(first.Msg.Record.Nodes))
	}
	var rec tetherv1.ReconciliationRecord
	if err := protojson.Unmarshal([]byte(mustCLI(t, srv.URL, srv.Admin, "record", "show", id, "-o", "json")), &rec); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, n := range rec.Nodes {
		seen[n.NodeId]++
	}
	for n := range want {
		if seen[n] != 1 {
			t.Fatalf("record show prints node %s %d times, want once", n, seen[n])
		}
	}
	if len(rec.Nodes) != len(want) || rec.RecordId != first.Msg.Record.RecordId || len(rec.Phases) == 0 {
		t.Fatalf("record show: %d nodes (want %d), record %q, %d phases", len(rec.Nodes), len(want), rec.RecordId, len(rec.Phases))
	}
	if !strings.Contains(mustCLI(t, srv.URL, srv.Admin, "record", "show", id), fmt.Sprintf("Nodes: 0 confirmed, %d unaccounted", len(want))) {
		t.Fatal("the summary does not count every node")
	}
	out := mustCLI(t, srv.URL, srv.Admin, "record", "ls")
	if !strings.Contains(out, fmt.Sprintf("\t%d\t", len(want))) && !strings.Contains(out, fmt.Sprintf(" %d ", len(want))) {
		t.Fatalf("record ls does not count %d nodes:\n%s", len(want), out)
	}
}
