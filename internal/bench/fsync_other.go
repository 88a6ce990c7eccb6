//go:build !linux

package bench

import (
	"os"
	"time"
)

func datasync(f *os.File) error { return f.Sync() }

// childCPU is not measured on this platform.
func childCPU(int) (time.Duration, bool) { return 0, false }
