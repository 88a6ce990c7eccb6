package rollout

import (
	"testing"

	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestKeyLayout pins the rollouts' storage keys, and the prefixes of the
// tree and the terminations its reconciler watches: data written by an
// earlier version must still load, so a key may never change.
func TestKeyLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(rolloutKey("o_1")), "rollouts/o_1"},
		{tree.NodePrefix, "agents/node/"},
		{supervisor.TerminationPrefix, "terminations/"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
