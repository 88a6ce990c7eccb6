package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("this binary carries no build information")
			}
			printVersion(cmd.OutOrStdout(), info)
			return nil
		},
	}
}

// printVersion writes what the Go toolchain recorded at build time: the
// module's version ("(devel)" for a build from a work tree), the VCS
// revision and whether the tree had uncommitted changes, and the Go
// version.
func printVersion(w io.Writer, info *debug.BuildInfo) {
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	revision := orDash(settings["vcs.revision"])
	if settings["vcs.modified"] == "true" {
		revision += " (modified)"
	}
	fmt.Fprintf(w, "tether %s\nrevision:  %s\ncommitted: %s\ngo:        %s\n",
		info.Main.Version, revision, orDash(settings["vcs.time"]), info.GoVersion)
}
