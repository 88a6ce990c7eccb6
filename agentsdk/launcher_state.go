package agentsdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// launcherState is what a launcher with a StateDir keeps for its next
// run, in <StateDir>/<Instance>.state.
type launcherState struct {
	// Clean: the run that wrote it stopped its agents (Run returned);
	// nothing it started runs on, and its next run starts afresh.
	Clean bool `json:"clean"`
	// Backoff is the next restart's pause; LastStart the last agent
	// start, on the launcher's Clock.
	Backoff   time.Duration `json:"backoff"`
	LastStart time.Time     `json:"last_start"`
	// Procs are the agent processes still running, as far as it knew.
	Procs []stateProc `json:"procs,omitempty"`
}

// stateProc is one agent process: its pid, its start (Linux: clock ticks
// since boot, /proc/<pid>/stat; 0 where the platform gives none, and
// then the pid is not trusted to be the same process) and its node.
type stateProc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
	Node  string `json:"node"`
}

func (l *Launcher) statePath(ext string) string {
	return filepath.Join(l.cfg.StateDir, l.cfg.Instance+ext)
}

// claimInstance takes the instance's lock, held until release (or until
// the launcher's process dies): a second launcher of the instance is
// refused rather than take the first's nodes for a dead predecessor's
// (rogue38h test). Without a StateDir there is nothing to claim.
func (l *Launcher) claimInstance() (release func(), err error) {
	if l.cfg.StateDir == "" {
		return func() {}, nil
	}
	if err := checkStateDir(l.cfg.StateDir); err != nil {
		return nil, err
	}
	path := l.statePath(".lock")
	f, err := lockExclusive(path)
	if errors.Is(err, errLockHeld) {
		return nil, fmt.Errorf("agentsdk: launcher instance %q is claimed by another launcher that is running (it holds %s); two launchers of one instance would stop each other's agents", l.cfg.Instance, path)
	}
	if err != nil {
		return nil, fmt.Errorf("agentsdk: claim launcher instance %q: %w", l.cfg.Instance, err)
	}
	return func() { _ = f.Close() }, nil
}

var errLockHeld = errors.New("held")

// readState returns the previous run's state, nil if there is none.
func (l *Launcher) readState() (*launcherState, error) {
	if l.cfg.StateDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(l.statePath(".state"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agentsdk: read the state of launcher instance %q: %w", l.cfg.Instance, err)
	}
	var st launcherState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("agentsdk: the state of launcher instance %q (%s) is not readable: %w", l.cfg.Instance, l.statePath(".state"), err)
	}
	return &st, nil
}

// takeOver acts on the previous run's state: it kills the processes a run
// that died left running, and returns the pause before the first start
// (the backoff the dead run would have waited, now doubled) when that run
// started an agent less than MaxRestartBackoff before. Run's goroutine,
// before anything starts.
func (l *Launcher) takeOver() (time.Duration, error) {
	st, err := l.readState()
	if err != nil || st == nil || st.Clean {
		return 0, err
	}
	for _, p := range st.Procs {
		switch killed, err := killLeft(p.Pid, p.Start); {
		case err != nil:
			l.cfg.Log.Warn("cannot stop a process a previous run of this launcher left", "pid", p.Pid, "node_id", p.Node, "error", err)
		case killed:
			l.cfg.Log.Warn("killed a process a previous run of this launcher left", "pid", p.Pid, "node_id", p.Node, "instance", l.cfg.Instance)
		}
	}
	now := l.cfg.Clock.Now()
	var pause time.Duration
	if !st.LastStart.IsZero() && now.Sub(st.LastStart) < MaxRestartBackoff {
		// The state is the predecessor's word: never more than
		// MaxRestartBackoff, however long it says (rogue38h test).
		pause = min(max(st.Backoff, MinRestartBackoff), MaxRestartBackoff)
		l.backoff = min(2*pause, MaxRestartBackoff)
	} else {
		l.backoff = MinRestartBackoff
	}
	l.lastStart = st.LastStart
	return pause, l.saveState(false)
}

// saveState writes what the next run must know (clean: Run is returning,
// its agents stopped). It writes only what changed. Run's goroutine.
func (l *Launcher) saveState(clean bool) error {
	if l.cfg.StateDir == "" {
		return nil
	}
	st := launcherState{Clean: clean}
	if !clean {
		st.Backoff, st.LastStart = l.backoff, l.lastStart
		l.mu.Lock()
		for _, p := range l.procs {
			if !isClosed(p.exited) {
				st.Procs = append(st.Procs, stateProc{Pid: p.cmd.Process.Pid, Start: p.pidStart, Node: p.node})
			}
		}
		l.mu.Unlock()
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if bytes.Equal(b, l.stateSaved) {
		return nil
	}
	tmp, err := os.CreateTemp(l.cfg.StateDir, l.cfg.Instance+".state.*")
	if err != nil {
		return fmt.Errorf("agentsdk: write the state of launcher instance %q: %w", l.cfg.Instance, err)
	}
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("agentsdk: write the state of launcher instance %q: %w", l.cfg.Instance, err)
	}
	if err := os.Rename(tmp.Name(), l.statePath(".state")); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("agentsdk: write the state of launcher instance %q: %w", l.cfg.Instance, err)
	}
	l.stateSaved = b
	return nil
}
