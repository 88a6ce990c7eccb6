package main

import (
	"errors"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

// globals are the flags every client command shares.
type globals struct {
	addr      string
	token     string
	tokenFile string
	dataDir   string
	output    string
	// TLS of the client: the server's CA, and a client certificate for a
	// server that requires one (serve --tls-client-ca).
	tlsCA, tlsClientCert, tlsClientKey string
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "tether",
		Short:         "Tether keeps every agent of an AI agent swarm on a revocable tether",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f := root.PersistentFlags()
	f.StringVar(&g.addr, "addr", envOr("TETHER_ADDR", "http://127.0.0.1:7420"), "control plane address")
	f.StringVar(&g.token, "token", "", "bearer token (default: $TETHER_TOKEN, then --token-file, then the local admin token)")
	f.StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token")
	f.StringVar(&g.dataDir, "data-dir", envOr("TETHER_DATA_DIR", "./tether-data"), "data directory (serve; and where the CLI finds the local admin token)")
	f.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	f.StringVar(&g.tlsCA, "tls-ca", envOr("TETHER_TLS_CA", ""), "PEM CA that signed the server's certificate, for an https:// --addr (default: the system roots; $TETHER_TLS_CA)")
	f.StringVar(&g.tlsClientCert, "tls-client-cert", envOr("TETHER_TLS_CLIENT_CERT", ""), "client certificate (PEM) to present to a server that requires one ($TETHER_TLS_CLIENT_CERT)")
	f.StringVar(&g.tlsClientKey, "tls-client-key", envOr("TETHER_TLS_CLIENT_KEY", ""), "the client certificate's private key (PEM; $TETHER_TLS_CLIENT_KEY)")
	root.AddCommand(
		newServeCommand(g),
		newAgentCommand(g),
		newTokenCommand(g),
		newLeaseCommand(g),
		newGrantCommand(g),
		newWhoAmICommand(g),
		newTerminateCommand(g),
		newTerminationCommand(g),
		newRecordCommand(g),
		newProposalCommand(g),
		newRuleCommand(g),
		newRolloutCommand(g),
		newKeysCommand(g),
		newMCPCommand(g),
		newDemoCommand(),
	)
	return root
}

func asConnectError(err error, target **connect.Error) bool { return errors.As(err, target) }
