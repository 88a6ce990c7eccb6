// Command tether is the Tether control plane (`tether serve`) and its CLI.
package main

import (
	"context"
	"fmt"
	"os"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

func main() {
	if cmd, err := run(context.Background(), os.Args[1:]); err != nil {
		err = inUserVocabulary(cmd, err)
		if ce := new(connect.Error); asConnectError(err, &ce) {
			fmt.Fprintf(os.Stderr, "error: %s: %s\n", ce.Code(), ce.Message())
		} else {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
		}
		os.Exit(1)
	}
}

// run executes one command inside the process's tracing (trace.go).
func run(ctx context.Context, args []string) (*cobra.Command, error) {
	root := newRootCommand()
	root.SetArgs(args)
	ctx, end := startTracing(ctx, root, args)
	cmd, err := root.ExecuteContextC(ctx)
	end(err)
	return cmd, err
}
