package tree

import (
	"github.com/tetherhq/tether/internal/store"
)

// Observer is told, inside the writing transaction, of each spawn, which
// stop rules observe (supervisor/stoprule keeps per-node counters with
// them; the ledger has its own Observer for calls). Being in the writer's
// transaction, the counters are exactly what the tree holds: no event can
// be lost or counted twice across a crash. An Observer must be cheap (it
// runs on the commit path) and must not call Update.
type Observer interface {
	// ObserveSpawn: a child was written under its parent.
	ObserveSpawn(tx store.Txn, child *Node) error
}
