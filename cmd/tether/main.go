// Command tether is the Tether control plane (`tether serve`) and its CLI.
package main

import (
	"fmt"
	"os"

	"connectrpc.com/connect"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		if ce := new(connect.Error); asConnectError(err, &ce) {
			fmt.Fprintf(os.Stderr, "error: %s: %s\n", ce.Code(), ce.Message())
		} else {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
		}
		os.Exit(1)
	}
}
