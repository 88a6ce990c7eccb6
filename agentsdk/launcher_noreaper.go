//go:build !linux

package agentsdk

import (
	"errors"
	"time"
)

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

// procStart: outside Linux a process's start is not read; a previous
// run's process is then never taken for the same (killLeft).
func procStart(int) uint64 { return 0 }

// killLeft: outside Linux a pid cannot be told from a later process's,
// so a previous run's process is not killed.
func killLeft(pid int, _ uint64) (bool, error) {
	return false, errors.New("agentsdk: outside Linux a previous run's process cannot be told from a later one with its pid")
}
