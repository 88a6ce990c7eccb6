package rollout

import (
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestRogue45EOnlyARolloutsOwnFactsKickIt: the changes kickFor is handed
// kick an unfinished rollout only when they may move it. A termination
// that is none of its batches', a node labelled like a replacement that
// never reported ready, and a write that changes nothing the rollout reads
// of a node (a ready replacement's heartbeat) kicked it, each a reconcile
// that reads every node; its batch's termination, a candidate's exit and
// a replacement's readiness still do.
func TestRogue45EOnlyARolloutsOwnFactsKickIt(t *testing.T) {
	at := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	rs := &Rollouts{}
	rs.track(Rollout{ID: "ro_1", Selector: "version=v1", TargetSelector: "version=v2", State: RolloutRunning,
		Batches: []RolloutBatch{{Index: 0, TerminationID: "tm_batch"}, {Index: 1, TerminationID: "tm_done", CompletedAt: at}}})
	node := func(id, version string, state tree.NodeState, ready time.Time, seen time.Time) store.Event {
		b, err := tree.MarshalNode(&tree.Node{NodeID: id, Labels: map[string]string{"version": version}, State: state, ReadyAt: ready, LastSeenAt: seen})
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{Type: store.EventPut, Key: []byte(tree.NodePrefix + id), Value: b}
	}
	term := func(id string) store.Event {
		return store.Event{Type: store.EventPut, Key: []byte(supervisor.TerminationPrefix + id), Value: []byte("{}")}
	}
	for _, c := range []struct {
		what string
		ev   store.Event
		kick bool
	}{
		{"another tree's termination", term("tm_rogue"), false},
		{"a finished batch's termination", term("tm_done"), false},
		{"its unfinished batch's termination", term("tm_batch"), true},
		{"a look-alike spawned", node("n_look", "v2", tree.NodeStateRunning, time.Time{}, at), false},
		{"the look-alike's heartbeat", node("n_look", "v2", tree.NodeStateRunning, time.Time{}, at.Add(time.Second)), false},
		{"the look-alike stopped", node("n_look", "v2", tree.NodeStateAborting, time.Time{}, at.Add(time.Second)), false},
		{"a replacement ready", node("n_v2", "v2", tree.NodeStateRunning, at, at), true},
		{"the replacement's heartbeat", node("n_v2", "v2", tree.NodeStateRunning, at, at.Add(10*time.Second)), false},
		{"the replacement stopped", node("n_v2", "v2", tree.NodeStateDraining, at, at.Add(10*time.Second)), true},
		{"a candidate spawned", node("n_v1", "v1", tree.NodeStateRunning, time.Time{}, at), true},
		{"the candidate's heartbeat", node("n_v1", "v1", tree.NodeStateRunning, time.Time{}, at.Add(10*time.Second)), false},
		{"the candidate's exit claimed", node("n_v1", "v1", tree.NodeStateExited, time.Time{}, at.Add(10*time.Second)), true},
		{"an agent neither selector matches", node("n_x", "v3", tree.NodeStateRunning, at, at), false},
	} {
		var kicked []string
		rs.kickFor([]store.Event{c.ev}, func(k string) { kicked = append(kicked, k) })
		if got := len(kicked) > 0; got != c.kick {
			t.Errorf("%s: kicked %v, want a kick %v", c.what, kicked, c.kick)
		}
	}
}
