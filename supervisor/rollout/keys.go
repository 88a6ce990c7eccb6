package rollout

import (
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Rollout keys.
const prefixRollout = "rollouts/" // rollouts/<id> → Rollout (JSON)

func rolloutKey(id string) []byte { return []byte(prefixRollout + id) }

// The reconciler also watches the tree's nodes and the terminations.
const (
	prefixNode        = tree.NodePrefix
	prefixTermination = supervisor.TerminationPrefix
)
