package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherhq/tether/controlplane"
)

// TestDataDirectoryIsMadePrivate: the data directory holds the store, the
// signing keys and admin.token; whatever mode it had, the server makes it
// 0700 at start, and refuses a path that is not a directory.
func TestDataDirectoryIsMadePrivate(t *testing.T) {
	for _, mode := range []os.FileMode{0o755, 0o777, 0o750, 0o700} {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		srv, err := controlplane.New(context.Background(), controlplane.Config{DataDir: dir, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		srv.Close()
		info, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != 0o700 {
			t.Fatalf("a data directory of mode %#o is %#o after start, want 0700", mode, got)
		}
		token, err := os.Stat(filepath.Join(dir, "admin.token"))
		if err != nil || token.Mode().Perm() != 0o600 {
			t.Fatalf("admin.token: %v %v", token, err)
		}
	}
	// A new directory is created private.
	fresh := filepath.Join(t.TempDir(), "a", "b")
	srv, err := controlplane.New(context.Background(), controlplane.Config{DataDir: fresh, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if info, err := os.Stat(fresh); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("a new data directory: %v %v", info.Mode(), err)
	}
	// A file where the directory should be is refused, clearly.
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.New(context.Background(), controlplane.Config{DataDir: file, Logger: quietLogger()}); err == nil || !strings.Contains(err.Error(), "data directory") {
		t.Fatalf("a file as data directory: %v", err)
	}
}
