//go:build unix

package agentsdk

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// canKeepState: a launcher can claim its instance and keep its state.
const canKeepState = true

// checkStateDir refuses a state directory that is not the launcher's
// user's alone to write: another user who may write it could hold the
// instance's lock (keeping every launcher run from starting) or rewrite
// the processes the next run kills.
func checkStateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("agentsdk: launcher state directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("agentsdk: launcher state directory %s is not a directory", dir)
	}
	if int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("agentsdk: launcher state directory %s may be written by a user other than the launcher's (owner uid %d, mode %v); make it the launcher user's, writable by it alone", dir, st.Uid, fi.Mode().Perm())
	}
	return nil
}

// lockExclusive opens path (created 0600) and takes its flock without
// waiting; errLockHeld if another holds it. The file is the launcher
// user's alone, and its descriptor is not inherited by the agents
// (close-on-exec), so no agent holds the lock once the launcher is gone.
func lockExclusive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not the launcher user's alone (mode %v)", path, fi.Mode().Perm())
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}
