package supervisor

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue25ReviewLargeNodesCannotGrowTheNodeCachePastItsBytes: on
// etcd the node cache keeps every node the watch delivers, bounded at
// 65,536 nodes, which docs/capacity.md put at about 20 MB (300 bytes a
// node). A rogue spawns its nodes as large as the tree allows (32 labels
// of 63-byte keys and values: about 5 KB each, as the watch delivers
// them); 65,536 such nodes were all kept, over 300 MB of values. The
// cache is now bounded by bytes too, and still keeps what the watch
// delivers last.
func TestRogue25ReviewLargeNodesCannotGrowTheNodeCachePastItsBytes(t *testing.T) {
	s, st := etcdMarkTestSupervisor(t)
	ctx := context.Background()
	tr := &tree.Tree{Store: st, Clock: s.Clock, Limits: tree.DefaultLimits}
	w, err := st.Watch(t.Context(), []byte(tree.NodePrefix))
	if err != nil {
		t.Fatal(err)
	}
	root, err := tr.RegisterRoot(ctx, "root", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for i := range tr.Limits.MaxLabels {
		labels[fmt.Sprintf("%02d", i)+strings.Repeat("k", 61)] = strings.Repeat("v", 63)
	}
	big, err := tr.Spawn(ctx, root.NodeID, strings.Repeat("a", 63), labels, "agent:"+root.NodeID, func(*tree.Node) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	// The large node's event, as the watch delivers it.
	var event store.Event
	for event.Revision == 0 {
		var batch []store.Event
		var ok bool
		select {
		case batch, ok = <-w.Events():
		case <-t.Context().Done():
			t.Fatal("test ended")
		}
		if !ok {
			t.Fatal("the node watch ended")
		}
		for _, ev := range batch {
			if string(ev.Key) == string(tree.NodeKey(big.NodeID)) && ev.Type == store.EventPut {
				event = ev
			}
		}
	}
	s.nodes.reset(st)
	// The rogue's 65,536 nodes like it, each delivered by the watch.
	const rogue = 1 << 16
	for i := range rogue {
		ev := event
		ev.Key = tree.NodeKey(fmt.Sprintf("%s%06d", big.NodeID, i))
		s.nodes.apply([]store.Event{ev})
	}
	s.nodes.mu.Lock()
	kept, bytes := len(s.nodes.nodes), 0
	for id, k := range s.nodes.nodes {
		bytes += len(id) + len(k.value)
	}
	s.nodes.mu.Unlock()
	const bound = 32 << 20
	if bytes > bound {
		t.Errorf("a rogue's %d nodes of %d bytes each: the node cache keeps %d of them, %d bytes; want at most %d", rogue, len(event.Value), kept, bytes, bound)
	}
	// What the watch delivers last is still kept (the mark takes it).
	last := event
	last.Key = tree.NodeKey(root.NodeID)
	s.nodes.apply([]store.Event{last})
	if _, ok := s.nodes.value(root.NodeID); !ok {
		t.Error("a node the watch delivered after the rogue's is not kept")
	}
	// The bytes counted are the entries' (whatever mix of the cache's
	// uses: a chunk's placeholders, the mark's values, a record's
	// forgetting, deletes).
	ids := []string{root.NodeID, big.NodeID, "n_placeholder"}
	s.nodes.await(ids)
	s.nodes.keep([]*tree.Node{big})
	s.nodes.settle(ids)
	s.nodes.forget([]string{root.NodeID})
	gone := event
	gone.Type, gone.Value, gone.Key = store.EventDelete, nil, tree.NodeKey(fmt.Sprintf("%s%06d", big.NodeID, rogue-1))
	s.nodes.apply([]store.Event{gone})
	s.nodes.mu.Lock()
	counted := 0
	for id, k := range s.nodes.nodes {
		counted += keptCost(id, k)
	}
	if counted != s.nodes.bytes || counted > maxKeptBytes || len(s.nodes.nodes) > maxKeptNodes {
		t.Errorf("the cache counts %d bytes; its %d entries take %d (bounds %d bytes, %d entries)", s.nodes.bytes, len(s.nodes.nodes), counted, maxKeptBytes, maxKeptNodes)
	}
	s.nodes.mu.Unlock()
}
