package controlplane

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
)

// privateDir makes the data directory private to the server's user
// (0700), creating it if needed: it holds the store, the signing keys,
// admin.token and the records. A wider mode is tightened at start, with a
// warning; a directory the server cannot tighten (another user owns it) is
// refused, naming the fix.
func privateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("controlplane: data directory: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("controlplane: data directory: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("controlplane: data directory %s is not a directory", dir)
	}
	mode := info.Mode().Perm()
	if mode&0o077 == 0 && info.Mode()&(fs.ModeSetgid|fs.ModeSetuid|fs.ModeSticky) == 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("controlplane: data directory %s has mode %#o, readable by other users, and cannot be made private (0700): %w; make the server's user its owner or choose another --data-dir", dir, mode, err)
	}
	log.Warn("the data directory was readable by other users; made it private (0700)", "dir", dir, "was", fmt.Sprintf("%#o", mode))
	return nil
}
