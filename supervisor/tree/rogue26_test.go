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
