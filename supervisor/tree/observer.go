package tree

import (
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Observer is told, inside the writing transaction, of the changes that
// stop rules observe (supervisor/stoprule keeps per-node counters with
// them). Being in the writer's transaction, the counters are exactly what
// the ledger and the tree hold: no event can be lost or counted twice
// across a crash. An Observer must be cheap (it runs on the commit path)
// and must not call Update.
type Observer interface {
	// ObserveCall: a call was written; before is the stored call before
	// the change (nil for a new call).
	ObserveCall(tx store.Txn, before, after *tetherv1.ToolCall) error
	// ObserveSpawn: a child was written under its parent.
	ObserveSpawn(tx store.Txn, child *tetherv1.Node) error
}
