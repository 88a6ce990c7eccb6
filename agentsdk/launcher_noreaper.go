//go:build !linux

package agentsdk

import "time"

// orphanWatch: outside Linux there is no subreaper; the launcher reaches
// only the agent's process group (unix) or its process (elsewhere), and a
// process that leaves it is not looked for (docs/design.md §11).
type orphanWatch struct {
	err error // always nil: the group is all there is to watch
}

func watchOrphans(int) orphanWatch { return orphanWatch{} }

// sweepOrphans finds nothing: what the agent's process group held was
// killed already, and nothing else can be seen.
func sweepOrphans(orphanWatch, time.Time) error { return nil }
