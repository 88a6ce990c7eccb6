package tree_test

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/populated"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
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
	}
}

// TestStoredNodesKeepTheTetherV1Encoding: a node this version stores reads,
// as a tether.v1.Node, exactly as the RPC edge shows it (so the previous
// version, which stored and read the message itself, reads it), and a
// node the previous version stored reads back as the same node.
func TestStoredNodesKeepTheTetherV1Encoding(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	n := fullNode()
	if unset := populated.Unset(n); len(unset) > 0 {
		t.Fatalf("the test node leaves %v unset: set them, or the test does not cover them", unset)
	}

	var stored []byte
	err = st.Update(ctx, func(tx store.Txn) error {
		if err := tree.PutNodeIn(tx, n); err != nil {
			return err
		}
		stored, err = tx.Get(tree.NodeKey(n.NodeID))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var m tetherv1.Node
	if err := proto.Unmarshal(stored, &m); err != nil {
		t.Fatalf("the stored node is not a tether.v1.Node: %v", err)
	}
	if want := wire.Node(n); !proto.Equal(&m, want) {
		t.Fatalf("the stored node reads as\n%v\nwant (as the edge shows it)\n%v", &m, want)
	}
	if state, err := tree.StoredState(stored); err != nil || state != n.State {
		t.Fatalf("StoredState (the census's decoding) = %v, %v; want %v", state, err, n.State)
	}

	old := wire.Node(n)
	old.NodeId = "n_older"
	b, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	var got *tree.Node
	err = st.Update(ctx, func(tx store.Txn) error {
		if err := tx.Put(tree.NodeKey(old.NodeId), b); err != nil {
			return err
		}
		got, err = tree.GetNodeIn(tx, old.NodeId)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fullNode()
	want.NodeID = "n_older"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("a node the previous version stored reads as\n%+v\nwant\n%+v", got, want)
	}
	var watched tree.Node
	if err := tree.UnmarshalNode(b, &watched); err != nil || !reflect.DeepEqual(&watched, want) {
		t.Fatalf("UnmarshalNode (the watchers' decoding) = %+v, %v; want %+v", &watched, err, want)
	}
}
