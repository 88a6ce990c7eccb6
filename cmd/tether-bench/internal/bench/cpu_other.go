//go:build !unix

package bench

import "time"

// processCPU is not measured on this platform.
func processCPU() (time.Duration, bool) { return 0, false }

// childCPU is not measured on this platform.
func childCPU(int) (time.Duration, bool) { return 0, false }

// childSwitches is not measured on this platform.
func childSwitches(int) (uint64, bool) { return 0, false }
