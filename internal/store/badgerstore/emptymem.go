package badgerstore

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// removeEmptyMemtables deletes the empty memtable logs (*.mem files of zero
// bytes) in dir before Badger opens it.
//
// Badger creates a memtable's log and then sizes it; a process killed in
// between leaves a zero-byte .mem file, and the next badger.Open fails with
// "while opening memtables ... Create a new file" (Badger issue 2207) until
// someone removes it. An empty log holds no write, acknowledged or not, so
// removing it loses nothing: Badger opens as if the file had never been
// created.
func removeEmptyMemtables(dir string, log *slog.Logger) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("store: open badger: %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Size() != 0 {
			continue
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("store: open badger: removing an empty memtable log left by a crash: %w", err)
		}
		log.Warn("store: removed an empty memtable log left by a crash (it held no writes)", "file", filepath.Base(p))
	}
	return nil
}
