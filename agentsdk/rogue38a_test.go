package agentsdk_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// The thirty-eighth hostile pass on the agent SDKs, as used by an honest
// agent (or operator) whose child is the rogue.

// rogue38aLabels is every label a node may carry, each value as long as
// allowed: the rogue's children are as large as it can make them.
func rogue38aLabels(i int) map[string]string {
	labels := map[string]string{"team": "rogue"}
	for k := 0; len(labels) < 32; k++ {
		labels[fmt.Sprintf("k%02d", k)] = fmt.Sprintf("%02d-", i) + strings.Repeat("v", 60)
	}
	return labels
}

// TestRogue38AListSubtreeListsARoguesLargeSubtreeAPageAtATime: the rogue
// child of an honest parent spawns children carrying every label allowed
// until its subtree is one answer larger than the parent's connection
// reads. ListNodes of the subtree (whole) then fails for the parent and
// the operator alike; ListSubtree reads it a page at a time and lists it
// completely. The connection's read bound is lowered here (as a rogue
// subtree of ~3,800 such nodes exceeds MaxMessageBytes) so that the
// subtree stays small.
func TestRogue38AListSubtreeListsARoguesLargeSubtreeAPageAtATime(t *testing.T) {
	ctx := context.Background()
	srv := startEmbedded(t)
	operator := agentsdk.Dial(srv.URL, srv.AdminToken)
	parent, err := agentsdk.RegisterRoot(ctx, operator, "rogue38a-parent", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := parent.Spawn(ctx, "rogue38a-rogue", nil)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := agentsdk.Join(ctx, srv.URL, child.Credential, agentsdk.HTTP2Client(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	const spawned = 40
	specs := make([]agentsdk.ChildSpec, spawned)
	for i := range specs {
		specs[i] = agentsdk.ChildSpec{Name: fmt.Sprintf("grandchild-%02d", i), Labels: rogue38aLabels(i)}
	}
	kids, err := rogue.SpawnBatch(ctx, specs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{parent.NodeID(): true, rogue.NodeID(): true}
	for _, k := range kids {
		want[k.Node.NodeId] = true
	}

	const readMax = 32 << 10 // about 13 of the rogue's children
	small := connect.WithReadMaxBytes(readMax)
	for _, who := range []struct {
		name string
		conn *agentsdk.Conn
	}{
		{"parent", agentsdk.Dial(srv.URL, parent.Credential(), agentsdk.WithClientOptions(small))},
		{"operator", agentsdk.Dial(srv.URL, srv.AdminToken, agentsdk.WithClientOptions(small))},
	} {
		// The whole subtree in one answer: past what the connection reads.
		_, err := who.conn.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: parent.NodeID()}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("%s: the whole subtree's listing: %v, want resource_exhausted (the rogue's subtree is larger than one answer may be)", who.name, err)
		}
		nodes, err := agentsdk.ListSubtree(ctx, who.conn.Agent, &tetherv1.ListNodesRequest{RootNodeId: parent.NodeID(), PageSize: 8})
		if err != nil {
			t.Fatalf("%s: ListSubtree: %v", who.name, err)
		}
		got := map[string]bool{}
		for _, n := range nodes {
			if got[n.NodeId] {
				t.Fatalf("%s: ListSubtree listed %s twice", who.name, n.NodeId)
			}
			got[n.NodeId] = true
		}
		if len(got) != len(want) {
			t.Fatalf("%s: ListSubtree listed %d nodes, want %d", who.name, len(got), len(want))
		}
		for id := range want {
			if !got[id] {
				t.Fatalf("%s: ListSubtree left out %s", who.name, id)
			}
		}
		// A selector is applied to every page: the rogue's children only.
		sel, err := agentsdk.ListSubtree(ctx, who.conn.Agent, &tetherv1.ListNodesRequest{RootNodeId: parent.NodeID(), LabelSelector: "team=rogue", PageSize: 8})
		if err != nil || len(sel) != spawned {
			t.Fatalf("%s: ListSubtree team=rogue: %d nodes, %v; want %d", who.name, len(sel), err, spawned)
		}
	}
	// The agent's own subtree when no root is named.
	own, err := agentsdk.ListSubtree(ctx, rogue.Conn().Agent, &tetherv1.ListNodesRequest{PageSize: 8})
	if err != nil || len(own) != spawned+1 {
		t.Fatalf("the rogue's own subtree: %d nodes, %v; want %d", len(own), err, spawned+1)
	}
	if _, err := agentsdk.ListSubtree(ctx, operator.Agent, &tetherv1.ListNodesRequest{RootNodeId: parent.NodeID(), OneLevel: true}); err == nil {
		t.Fatal("ListSubtree with one_level: no error")
	}
}

// TestRogue38AChildIsToldTheConfirmDeadlineWhenItsDrainEndsAtTheMark: a
// rogue parent drains its honest child with a day's drain window and a
// minute's confirmation wait. The child has no call in flight, so its
// drain ends at the mark, its grants are revoked and the record waits a
// minute for its exit; but no node changes then, so the session sent only
// the drain signal of the request (no deadline yet, or the day's drain
// deadline): a child that does not heartbeat (or before its next
// last-seen write) planned a day, and its exit, unclaimed after the
// minute, was recorded unaccounted. The session must follow its stop's
// deadline and tell the child the minute's.
func TestRogue38AChildIsToldTheConfirmDeadlineWhenItsDrainEndsAtTheMark(t *testing.T) {
	ctx := context.Background()
	parent, _, srv, _ := rogue37aRoot(t, "rogue38a-rogue-parent")
	spawned, err := parent.Spawn(ctx, "rogue38a-child", nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := agentsdk.Join(ctx, srv.URL, spawned.Credential, nil)
	if err != nil {
		t.Fatal(err)
	}
	child.HeartbeatEvery = 24 * time.Hour // no last-seen write tells it later
	signals := rogue37aRun(t, child)
	resp, err := parent.Conn().Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN,
		DrainWindow: durationpb.New(24 * time.Hour), ConfirmTimeout: durationpb.New(time.Minute), Reason: "rogue38a"}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Termination.TerminationId
	sup := &supervisor.Supervisor{Store: srv.Store()}
	var confirm time.Time
	testserver.WaitFor(t, time.Minute, "the drain to end at the mark and the grants to be revoked", func() bool {
		term, err := sup.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		confirm = term.ConfirmDeadline
		return term.Phase == supervisor.PhaseReconciling && term.Revoked
	})
	guard := time.NewTimer(time.Minute) // against a hang, not a timing
	defer guard.Stop()
	for {
		select {
		case s := <-signals:
			if s.Abort {
				t.Fatalf("aborted before it was told the confirmation deadline: %+v", s)
			}
			if s.TerminationID == id && s.Deadline.Equal(confirm) {
				if got := child.DrainDeadline(); !got.Equal(confirm) {
					t.Fatalf("DrainDeadline is %v, the stop's confirmation deadline %v", got, confirm)
				}
				return
			}
		case <-guard.C:
			t.Fatalf("the child was never told its stop's confirmation deadline %v (its drain ended at the mark); DrainDeadline %v", confirm, child.DrainDeadline())
		}
	}
}
