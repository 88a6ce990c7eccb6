//go:build !linux

package bench

import "os"

func datasync(f *os.File) error { return f.Sync() }
