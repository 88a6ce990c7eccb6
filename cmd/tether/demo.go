package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherhq/tether/cmd/tether/internal/demo"
)

func newDemoCommand() *cobra.Command {
	var (
		opts   demo.Options
		useMCP bool
	)
	cmd := &cobra.Command{
		Use:   "demo [--workers 3] [--mode drain|abort] [--seed 1] [--mcp]",
		Short: "Play a swarm on an embedded control plane, terminate it, and show the record",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if useMCP {
				_, err := demo.RunMCP(cmd.Context(), opts, cmd.OutOrStdout())
				return err
			}
			_, err := demo.Run(cmd.Context(), opts, cmd.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Workers, "workers", 3, "workers under the planner (each spawns a retrieval and a code-execution agent)")
	f.StringVar(&opts.Mode, "mode", "drain", "termination mode: drain or abort")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed for tool latencies and the choice of the rogue")
	f.DurationVar(&opts.DrainWindow, "window", 2*time.Second, "drain window before escalation to abort")
	f.BoolVar(&useMCP, "mcp", false, "the MCP story instead: an agent's MCP calls through the MCP gateway, one drained, one refused, one aborted")
	f.StringVar(&opts.Dir, "dir", "", "where to keep the data and the record (default: a new temporary directory)")
	return cmd
}
