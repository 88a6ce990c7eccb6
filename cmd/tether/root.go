package main

import (
	"errors"
	"fmt"
	"strings"

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
	// tokenGiven is true when --token was on the command line, even empty:
	// an empty token is an error, never a fall back to the admin token.
	tokenGiven bool
	// TLS of the client: the server's CA, and a client certificate for a
	// server that requires one (serve --tls-client-ca).
	tlsCA, tlsClientCert, tlsClientKey string
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "tether",
		Short:         "Tether keeps every agent of an AI agent swarm on a revocable tether",
		Long:          "Tether keeps every agent of an AI agent swarm on a revocable tether.\n\n" + environmentHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			g.tokenGiven = cmd.Flags().Changed("token")
			g.addr = normalizeAddr(g.addr, g.tlsCA != "" || g.tlsClientCert != "")
			return checkPrintFlag(cmd)
		},
	}
	f := root.PersistentFlags()
	f.StringVar(&g.addr, "addr", envOr("TETHER_ADDR", "http://127.0.0.1:7420"), "control plane address; host:port means http:// (https:// with --tls-ca) ($TETHER_ADDR)")
	f.StringVar(&g.token, "token", "", "bearer token; see ENVIRONMENT in tether --help for where the CLI looks without it")
	f.StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token")
	f.StringVar(&g.dataDir, "data-dir", envOr("TETHER_DATA_DIR", "./tether-data"), "data directory (serve; and where the CLI finds the local admin token) ($TETHER_DATA_DIR)")
	f.StringVarP(&g.output, "output", "o", "table", "output format: table, wide (every table cell whole) or json (each command's --help lists the formats it takes)")
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
		newVersionCommand(),
	)
	refuseUnknownSubcommands(root)
	helpWithOutputFormats(root)
	return root
}

// outputFormats is the annotation a command sets when it takes formats
// other than table, wide and json (lease evidence: csv too).
const outputFormats = "output-formats"

// helpWithOutputFormats makes each command's help list the -o formats that
// command takes (the flag is shared, so its usage is set per help page).
func helpWithOutputFormats(root *cobra.Command) {
	help := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		if f := c.Flags().Lookup("output"); f != nil {
			usage := f.Usage
			formats := "table, wide (every table cell whole) or json"
			if v, ok := c.Annotations[outputFormats]; ok {
				formats = v
			}
			f.Usage = "output format: " + formats
			defer func() { f.Usage = usage }()
		}
		help(c, args)
	})
}

// environmentHelp is the root command's help on where the CLI finds its
// address and token.
const environmentHelp = `ENVIRONMENT
  TETHER_ADDR            control plane address (--addr; default http://127.0.0.1:7420)
  TETHER_TOKEN           bearer token (--token)
  TETHER_DATA_DIR        the server's data directory (--data-dir; default ./tether-data)
  TETHER_TLS_CA          CA of the server's certificate (--tls-ca)
  TETHER_TLS_CLIENT_CERT client certificate (--tls-client-cert)
  TETHER_TLS_CLIENT_KEY  its private key (--tls-client-key)

The CLI takes its token from the first of: --token, $TETHER_TOKEN, --token-file,
and, for a server on this machine (a loopback --addr), the admin token the server
wrote to <--data-dir>/admin.token (--data-dir, else $TETHER_DATA_DIR, else
./tether-data). An empty token is an error.`

// normalizeAddr accepts host:port for an address, as users type it, and
// makes it a URL.
func normalizeAddr(addr string, tls bool) string {
	if addr == "" || strings.Contains(addr, "://") {
		return addr
	}
	if tls {
		return "https://" + addr
	}
	return "http://" + addr
}

// refuseUnknownSubcommands makes every command group (agent, grant, ...)
// fail on an argument that names none of its subcommands, instead of
// printing help and exiting 0: `tether agent get ID` is a mistake a script
// must see.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if cmd.Runnable() || !cmd.HasSubCommands() || cmd.Parent() == nil {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		names := make([]string, 0, len(c.Commands()))
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		return fmt.Errorf("unknown command %q for %q; want one of: %s", args[0], c.CommandPath(), strings.Join(names, ", "))
	}
}

func asConnectError(err error, target **connect.Error) bool { return errors.As(err, target) }
