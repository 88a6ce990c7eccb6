package tree_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/compattest"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// fullNode has every field set, so that the compatibility test covers each.
func fullNode() *tree.Node {
	at := func(s int) time.Time { return time.Date(2026, 3, 1, 12, 0, s, 123456789, time.UTC) }
	return &tree.Node{
		NodeID: "n_child", ParentNodeID: "n_parent", Ancestors: []string{"n_root", "n_parent"},
		Name: "worker", Labels: map[string]string{"team": "a", "tier": "b"}, State: tree.NodeStateAborting,
		CreatedAt: at(1), CreatedBy: "operator:alice", LastSeenAt: at(2), ExitedAt: at(3),
		ExitConfirmedBy: "operator:launcher (launcher)", TerminationID: "t_1", ReadyAt: at(4),
		ExitConfirmations: []tree.ExitConfirmation{
			{By: "agent:n_child", Kind: tree.ConfirmedBySelf, At: at(3), Reason: "done"},
			{By: "operator:launcher", Kind: tree.ConfirmedByLauncher, At: at(5), Reason: "exit 0"},
		},
		Contradictions:  []tree.Contradiction{{Kind: tree.ActivityToolCall, At: at(6), Detail: "tool shell via gate g"}},
		SessionOpenedAt: at(7), SessionClosedAt: at(8),
		OpenSessions: []tree.OpenSession{{SessionID: "s_1", OpenedAt: at(7), Instance: "cp-1"}},
		Holds:        tree.HoldsTracked | tree.HoldsGrants | tree.HoldsCalls,
		LastSeenSeq:  3, SessionClosedSeq: 4,
		BelowAfterClaim: []tree.BelowAfterClaim{{NodeID: "n_grandchild", ParentNodeID: "n_child2", Kind: tree.ActivityRequest, At: at(9)}},
		StopSince:       at(10),
	}
}

// TestStoredNodesKeepTheTetherV1Encoding: a node this version stores reads,
// as a tether.v1.Node, exactly as the RPC edge shows it (so the previous
// version, which stored and read the message itself, reads it), and a
// node the previous version stored reads back as the same node.
func TestStoredNodesKeepTheTetherV1Encoding(t *testing.T) {
	stored, previous := compattest.Check(t, compattest.Stored[tree.Node, *tetherv1.Node]{
		Kind: "node", Full: fullNode,
		SetID: func(n *tree.Node, id string) { n.NodeID = id },
		Key:   tree.NodeKey, Put: tree.PutNodeIn, Get: tree.GetNodeIn, Wire: wire.Node,
		// What the node may hold, the order of its observations, a
		// never-sessioned descendant served after its claim and when it
		// first came under a stop are the store's own bookkeeping.
		StoreOnly: func(n *tree.Node) {
			n.Holds, n.LastSeenSeq, n.SessionClosedSeq, n.BelowAfterClaim, n.StopSince = 0, 0, 0, nil, time.Time{}
		},
	}, fullNode().NodeID, "n_older")
	if state, err := tree.StoredState(stored); err != nil || state != fullNode().State {
		t.Fatalf("StoredState (the census's decoding) = %v, %v; want %v", state, err, fullNode().State)
	}
	want := fullNode()
	want.NodeID, want.Holds, want.LastSeenSeq, want.SessionClosedSeq, want.BelowAfterClaim, want.StopSince = "n_older", 0, 0, 0, nil, time.Time{}
	var watched tree.Node
	if err := tree.UnmarshalNode(previous, &watched); err != nil || !reflect.DeepEqual(&watched, want) {
		t.Fatalf("UnmarshalNode (the watchers' decoding) = %+v, %v; want %+v", &watched, err, want)
	}
}
