package tree

import (
	"strings"
	"testing"
	"time"
)

// TestRogue26ASessionsEndCorroboratesAClaimOnlyAsTheLastSignOfTheNode:
// JudgeExit takes a session's end as the control plane's witness of a
// bare claim only when nothing of the node (its heartbeats, last_seen_at)
// came after that end; a launcher's attestation is weighed as before.
func TestRogue26ASessionsEndCorroboratesAClaimOnlyAsTheLastSignOfTheNode(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	none := func(string) bool { return false }
	node := func(closed, seen time.Duration, by ...ExitConfirmation) *Node {
		n := &Node{NodeID: "n_rogue", ExitedAt: t0.Add(2 * time.Hour), ExitConfirmations: by}
		n.SessionClosedAt = t0.Add(closed)
		if seen >= 0 {
			n.LastSeenAt = t0.Add(seen)
		}
		return n
	}
	claim := ExitConfirmation{By: "agent:n_rogue", Kind: ConfirmedBySelf, At: t0.Add(2 * time.Hour)}
	launcher := ExitConfirmation{By: "operator:launcher", Kind: ConfirmedByLauncher, At: t0.Add(2 * time.Hour)}
	for _, c := range []struct {
		name      string
		n         *Node
		confirmed bool
		reason    string
	}{
		{"the session's end after the last heartbeat", node(time.Hour, 30*time.Minute, claim), true, ""},
		{"the session's end at the last heartbeat's instant", node(time.Hour, time.Hour, claim), true, ""},
		{"never a heartbeat", node(time.Hour, -1, claim), true, ""},
		{"a heartbeat an hour after the end", node(0, time.Hour, claim), false, "alive (last seen"},
		{"a launcher attests all the same", node(0, time.Hour, claim, launcher), true, ""},
	} {
		v := JudgeExit(c.n, none, nil)
		if v.Confirmed != c.confirmed || !strings.Contains(v.UnaccountedReason, c.reason) {
			t.Errorf("%s: confirmed %v (by %q, reason %q), want %v", c.name, v.Confirmed, v.ConfirmedBy, v.UnaccountedReason, c.confirmed)
		}
		if !v.Confirmed && v.ClaimedBy == "" {
			t.Errorf("%s: the claim is not shown", c.name)
		}
	}
}

// TestRogue26AStoresOrderNotTheClocksSaysWhatCameAfterTheSessionsEnd: on
// etcd the heartbeat and the session's end may be stamped by replicas
// whose clocks differ. What came after the end is the store's order
// (LastSeenSeq, SessionClosedSeq), whatever the times say; a node whose
// two observations were both written before that order was kept is
// weighed by their times.
func TestRogue26AStoresOrderNotTheClocksSaysWhatCameAfterTheSessionsEnd(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	none := func(string) bool { return false }
	claim := ExitConfirmation{By: "agent:n_rogue", Kind: ConfirmedBySelf, At: t0.Add(2 * time.Hour)}
	node := func(closed time.Duration, closedSeq uint64, seen time.Duration, seenSeq uint64) *Node {
		return &Node{NodeID: "n_rogue", ExitedAt: claim.At, ExitConfirmations: []ExitConfirmation{claim},
			SessionClosedAt: t0.Add(closed), SessionClosedSeq: closedSeq, LastSeenAt: t0.Add(seen), LastSeenSeq: seenSeq}
	}
	for _, c := range []struct {
		name      string
		n         *Node
		confirmed bool
	}{
		{"a heartbeat after the end, stamped ten minutes earlier by a clock behind", node(time.Hour, 1, 50*time.Minute, 2), false},
		{"the end after the last heartbeat, stamped ten minutes earlier by a clock behind", node(50*time.Minute, 2, time.Hour, 1), true},
		{"a heartbeat after an end written before the order was kept", node(time.Hour, 0, 50*time.Minute, 1), false},
		{"an end after a heartbeat written before the order was kept", node(50*time.Minute, 1, time.Hour, 0), true},
		{"both written before the order was kept: the times", node(time.Hour, 0, 2*time.Hour, 0), false},
		{"both written before the order was kept, the end last", node(time.Hour, 0, 30*time.Minute, 0), true},
	} {
		v := JudgeExit(c.n, none, nil)
		if v.Confirmed != c.confirmed || SeenAfterSessionEnd(c.n) == c.confirmed || SessionEndIsLastSeen(c.n) != c.confirmed {
			t.Errorf("%s: confirmed %v (by %q, reason %q), seen after the end %v, the end last %v; want confirmed %v",
				c.name, v.Confirmed, v.ConfirmedBy, v.UnaccountedReason, SeenAfterSessionEnd(c.n), SessionEndIsLastSeen(c.n), c.confirmed)
		}
	}
	// The numbers a node's observations take: each past both.
	n := &Node{NodeID: "n_rogue", LastSeenSeq: 4, SessionClosedSeq: 7}
	if got := nextSeenSeq(n); got != 8 {
		t.Fatalf("nextSeenSeq = %d, want 8", got)
	}
}
