//go:build !unix

package agentsdk

import (
	"errors"
	"os"
)

// canKeepState: outside unix a launcher has no StateDir (NewLauncher
// refuses one).
const canKeepState = false

func checkStateDir(string) error {
	return errors.New("agentsdk: a launcher state directory needs unix")
}

func lockExclusive(string) (*os.File, error) {
	return nil, errors.New("agentsdk: a launcher state directory needs unix")
}
