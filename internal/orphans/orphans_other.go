//go:build !linux

package orphans

import (
	"errors"
	"time"
)

// Watch: outside Linux there is no subreaper; only the watched process's
// group (unix) or the process itself (elsewhere) can be reached, and a
// process that leaves it is not looked for (docs/design.md §11).
type Watch struct{}

// Err is always nil: the group is all there is to watch.
func (Watch) Err() error { return nil }

// Adopt adopts nothing: there is no subreaper.
func Adopt() error { return nil }

// Start watches nothing.
func Start(int) Watch { return Watch{} }

// Sweep finds nothing: what the watched process's group held was killed
// already, and nothing else can be seen.
func Sweep(Watch, time.Time) error { return nil }

// ProcStart: outside Linux a process's start is not read; a previous
// run's process is then never taken for the same (KillLeft).
func ProcStart(int) uint64 { return 0 }

// KillLeft: outside Linux a pid cannot be told from a later process's,
// so a previous run's process is not killed.
func KillLeft(int, uint64) (bool, error) {
	return false, errors.New("outside Linux a previous run's process cannot be told from a later one with its pid")
}
