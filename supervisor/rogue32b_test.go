package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue32BLastRoundWeighsAChunkOnceNotOncePerClaimer: on a record
// chunk's last round (maxChildrenRounds), a member whose descendants were
// not read apart is weighed against the chunk's nodes. Each claiming
// member scanned the whole chunk (every node's ancestors), so a rogue
// subtree of many claiming parents in one chunk had the record's
// transaction do members × nodes × depth steps — 400 claimers in a chunk
// of 801, some 400,000 — in a transaction etcd may run again. The chunk's
// live nodes are now collected once, each credited to its ancestors:
// steps bounded by the chunk's nodes and their ancestors, however many
// members ask. Guard: each claimer still finds its live descendant (and
// only its own), and one with none finds none.
func TestRogue32BLastRoundWeighsAChunkOnceNotOncePerClaimer(t *testing.T) {
	const width = 400
	root := &tree.Node{NodeID: "n_root", Holds: tree.HoldsTracked | tree.HoldsChildren}
	nodes := map[string]*tree.Node{root.NodeID: root}
	var all []string
	all = append(all, root.NodeID)
	var parents []*tree.Node
	for i := range width {
		p := &tree.Node{NodeID: fmt.Sprintf("n_p%03d", i), ParentNodeID: root.NodeID, Ancestors: []string{root.NodeID},
			Holds: tree.HoldsTracked | tree.HoldsChildren}
		c := &tree.Node{NodeID: fmt.Sprintf("n_c%03d", i), ParentNodeID: p.NodeID, Ancestors: []string{root.NodeID, p.NodeID},
			Holds: tree.HoldsTracked}
		// Every other grandchild is connected.
		if i%2 == 0 {
			c.OpenSessions = []tree.OpenSession{{SessionID: "s_" + c.NodeID, OpenedAt: time.Unix(0, 0)}}
		}
		nodes[p.NodeID], nodes[c.NodeID] = p, c
		all = append(all, p.NodeID, c.NodeID)
		parents = append(parents, p)
	}
	bound := 0
	for _, n := range nodes {
		bound += 1 + len(n.Ancestors)
	}
	c := childrenRead{alive: map[string]aliveBelow{}, read: map[string]bool{}, last: true}
	if d := c.aliveChild(root, nodes, all).node; d == nil {
		t.Fatal("the root found no live descendant, want one of the connected grandchildren")
	}
	for i, p := range parents {
		d := c.aliveChild(p, nodes, all).node
		want := ""
		if i%2 == 0 {
			want = fmt.Sprintf("n_c%03d", i)
		}
		got := ""
		if d != nil {
			got = d.NodeID
		}
		if got != want {
			t.Fatalf("parent %s found live descendant %q, want %q", p.NodeID, got, want)
		}
	}
	if len(c.need) != 0 {
		t.Fatalf("the last round asked for descendants to be read: %v", c.need)
	}
	if c.steps > bound {
		t.Fatalf("the last round took %d steps for %d claimers in a chunk of %d nodes, want at most %d (each node and its ancestors once)",
			c.steps, width+1, len(nodes), bound)
	}
}

// TestRogue32BAClaimPastTheRecordsRoundsIsNotCorroboratedUnread: a
// member whose bare claim came to be corroborated while its record chunk
// was being written, past the rounds that read members' descendants apart
// (maxChildrenRounds: a rogue subtree claiming member after member as the
// rounds run), is weighed on the last round against the chunk's own nodes
// only. A descendant of it at work outside the chunk — a grandchild in
// another chunk, its feed open — went unseen, and the member's claim read
// CONFIRMED by the control plane. Its descendants unread, it is now not
// corroborated. Guard: a live descendant in the chunk is still named.
func TestRogue32BAClaimPastTheRecordsRoundsIsNotCorroboratedUnread(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	member := &tree.Node{NodeID: "n_member", Holds: tree.HoldsTracked | tree.HoldsChildren,
		SessionClosedAt: at, SessionClosedSeq: 1, LastSeenAt: at.Add(-time.Second),
		ExitConfirmations: []tree.ExitConfirmation{{By: "agent:n_member", Kind: tree.ConfirmedBySelf, At: at.Add(time.Second)}}}
	inStopped := func(string) bool { return true }
	if v := tree.JudgeExit(member, inStopped, nil); !tree.WeighedBeside(v) {
		t.Fatalf("the member's claim alone reads %+v, want corroborated by the control plane", v)
	}
	// The chunk: the member and a child of its that is not at work; the
	// grandchild at work is in another chunk.
	child := &tree.Node{NodeID: "n_child", ParentNodeID: member.NodeID, Ancestors: []string{member.NodeID}, Holds: tree.HoldsTracked | tree.HoldsChildren}
	nodes := map[string]*tree.Node{member.NodeID: member, child.NodeID: child}
	all := []string{member.NodeID, child.NodeID}
	c := childrenRead{alive: map[string]aliveBelow{}, read: map[string]bool{}, last: true}
	v := tree.JudgeExitBeside(member, inStopped, nil, c.aliveChild(member, nodes, all).beside(tree.Beside{}))
	if v.Confirmed || !strings.Contains(v.UnaccountedReason, "not read") {
		t.Fatalf("the member, its descendants unread on the last round: %+v, want unaccounted, saying they were not read", v)
	}
	// Guard: one at work in the chunk is named.
	child.OpenSessions = []tree.OpenSession{{SessionID: "s_child", OpenedAt: at}}
	c = childrenRead{alive: map[string]aliveBelow{}, read: map[string]bool{}, last: true}
	v = tree.JudgeExitBeside(member, inStopped, nil, c.aliveChild(member, nodes, all).beside(tree.Beside{}))
	if v.Confirmed || !strings.Contains(v.UnaccountedReason, child.NodeID) {
		t.Fatalf("the member, its child at work in the chunk: %+v, want unaccounted naming %s", v, child.NodeID)
	}
}
