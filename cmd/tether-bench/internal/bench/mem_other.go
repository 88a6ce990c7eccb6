//go:build !linux

package bench

func residentBytes(int) (uint64, bool)  { return 0, false }
func processWithArg(string) (int, bool) { return 0, false }
func diskBytes(string) (uint64, bool)   { return 0, false }

// LoadAverage is not read on this platform.
func LoadAverage() (float64, bool) { return 0, false }
