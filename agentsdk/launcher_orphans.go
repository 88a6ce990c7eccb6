package agentsdk

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/internal/orphans"
)

// orphanWatch is what the launcher needs to find an agent's orphans: on
// Linux the launcher's process adopts them as a child subreaper (from the
// first launch, for the whole program); elsewhere there is none, and the
// launcher reaches only the agent's process group (unix) or its process
// (internal/orphans).
type orphanWatch struct {
	w orphans.Watch
	// err: orphans are not adopted, so none can be proven gone.
	err error
}

// watchOrphans is called right after the agent's process pid started (and
// before it is waited for, so /proc/<pid> is there even if it exited).
// adoptOrphans makes the program's process a subreaper (Linux, once):
// before each start, so an agent's escapee is the launcher's from the
// agent's first instruction. An error shows again at watchOrphans.
func adoptOrphans() { _ = orphans.Adopt() }

func watchOrphans(pid int) orphanWatch {
	w := orphans.Start(pid)
	if err := w.Err(); err != nil {
		return orphanWatch{w: w, err: fmt.Errorf("agentsdk: the launcher cannot find the agent's orphans: %w", err)}
	}
	return orphanWatch{w: w}
}

// sweepOrphans kills and reaps, until none is left, every orphan the
// launcher's process adopted that may descend from the agent watched by
// w, with everything below it (orphans.Sweep: the program's children that
// started since the agent's process and that no os.Process of the program
// holds). It returns nil only once there is none left, and an error if
// that cannot be proven by deadline.
func sweepOrphans(w orphanWatch, deadline time.Time) error {
	if w.err != nil {
		return w.err
	}
	if err := orphans.Sweep(w.w, deadline); err != nil {
		return fmt.Errorf("agentsdk: what the agent left behind: %w", err)
	}
	return nil
}

// procStart returns when process pid started (clock ticks since boot),
// 0 if it cannot be read (and always outside Linux).
func procStart(pid int) uint64 { return orphans.ProcStart(pid) }

// killLeft kills (SIGKILL) process pid and the process group it leads, if
// it is still the process that started at start: a process a previous
// run of the launcher left. It reports whether it killed anything.
func killLeft(pid int, start uint64) (bool, error) {
	killed, err := orphans.KillLeft(pid, start)
	if err != nil {
		return killed, fmt.Errorf("agentsdk: %w", err)
	}
	return killed, nil
}
