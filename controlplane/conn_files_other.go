//go:build !unix

package controlplane

// openFileLimit: unknown on this platform.
func openFileLimit() int { return 0 }
