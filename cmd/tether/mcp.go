package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
)

// The environment the MCP commands read.
const (
	envGateToken           = "TETHER_GATE_TOKEN"
	envCapabilityToken     = "TETHER_CAPABILITY_TOKEN"
	envCapabilityTokenFile = "TETHER_CAPABILITY_TOKEN_FILE"
)

func newMCPCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Put MCP tool calls on the tether: a gateway in front of MCP servers",
		Long: `The MCP gateway stands in front of real MCP servers (upstreams) and gates every
tools/call by the agent's capability token (scope mcp:<upstream>/<tool>), records it in
the control plane's tool-call ledger with the gateway's own credential, refuses new calls
while the agent drains, and cancels calls in flight when it is aborted. See docs/mcp.md.`,
	}
	cmd.AddCommand(newMCPServeCommand(g), newMCPWrapCommand(g), newMCPToolsCommand(g))
	return cmd
}

// gateFlags are the gateway's own identity.
type gateFlags struct {
	gateID, gateTokenFile string
	staleness, connect    time.Duration
	maxCalls              int
	owedReports           string
}

func (f *gateFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.gateID, "gate-id", "mcp-gateway", "the gateway's name in the ledger and the record")
	fs.StringVar(&f.gateTokenFile, "gate-token-file", "", "file holding the gateway's own credential: a tool server's token named like --gate-id (tether token create --tool-server NAME), read again whenever it is rewritten: renew it before it expires (default: $"+envGateToken+", then --token/$TETHER_TOKEN, which must then be one, and are read once)")
	fs.DurationVar(&f.staleness, "staleness-budget", 0, "refuse every call when the revocation feed is older than this (default 10s)")
	fs.DurationVar(&f.connect, "connect-timeout", mcpgate.DefaultConnectTimeout, "time an upstream has to answer its connection (MCP's initialize) and each listing of its tools; the gateway does not start without an upstream, and reconnects one whose connection ended, backing off")
	fs.StringVar(&f.owedReports, "owed-reports-file", "", "file (created 0600; it holds agents' tokens) where the gateway keeps the reports it owes the control plane (nodes it served whose reports did not land), so that a gateway killed or shut down with the control plane out of reach loses none: the next one started on the file sends them; one file per gateway (default: kept in memory only)")
	fs.IntVar(&f.maxCalls, "max-calls-per-node", mcpgate.DefaultMaxCallsPerNode, "tool calls one node may have in flight through the gateway at once (its next is refused, -32068)")
}

// credential is the gateway's token when no --gate-token-file gives it:
// never the agent's.
func (f *gateFlags) credential(g *globals) (string, error) {
	if v := os.Getenv(envGateToken); v != "" {
		return v, nil
	}
	if g.token == "" && os.Getenv("TETHER_TOKEN") == "" && g.tokenFile == "" {
		// The local admin token is an operator's: the ledger would refuse it.
		return "", fmt.Errorf("the gateway needs a tool server's token: --gate-token-file or $%s (tether token create --tool-server %s)", envGateToken, f.gateID)
	}
	return g.resolveToken()
}

// upstreamFlags declare the MCP servers behind the gateway.
type upstreamFlags struct {
	cmds, urls []string
	config     string
}

func (f *upstreamFlags) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.cmds, "upstream-cmd", nil, "a stdio upstream, NAME='command args…' (split on spaces; use --config for anything harder); repeatable")
	fs.StringArrayVar(&f.urls, "upstream-url", nil, "a Streamable HTTP upstream, NAME=URL; repeatable")
	fs.StringVar(&f.config, "config", "", `a JSON file {"upstreams":[{"name":…,"command":[…]|"url":…,"env":{…}}]}`)
}

func (f *upstreamFlags) upstreams() ([]mcpgate.Upstream, error) {
	var out []mcpgate.Upstream
	if f.config != "" {
		fc, err := mcpgate.LoadConfig(f.config)
		if err != nil {
			return nil, err
		}
		out = append(out, fc.Upstreams...)
	}
	for _, c := range f.cmds {
		name, command, ok := strings.Cut(c, "=")
		if !ok || len(strings.Fields(command)) == 0 {
			return nil, fmt.Errorf("--upstream-cmd %q: want NAME='command args…'", c)
		}
		out = append(out, mcpgate.Upstream{Name: name, Command: strings.Fields(command)})
	}
	for _, u := range f.urls {
		name, url, ok := strings.Cut(u, "=")
		if !ok {
			return nil, fmt.Errorf("--upstream-url %q: want NAME=URL", u)
		}
		out = append(out, mcpgate.Upstream{Name: name, URL: url})
	}
	if len(out) == 0 {
		return nil, errors.New("no upstream MCP server: pass --upstream-cmd, --upstream-url or --config")
	}
	return out, nil
}

func openGateway(ctx context.Context, g *globals, gf *gateFlags, ups []mcpgate.Upstream, logLevel string) (*mcpgate.Gateway, error) {
	var (
		cred    string
		renewed mcpgate.TokenSource
		err     error
	)
	if gf.gateTokenFile != "" {
		// Read again whenever it is rewritten: the gateway's streams end
		// with the token they were opened with, and reopen with the file's.
		renewed = &mcpgate.FileToken{Path: gf.gateTokenFile}
	} else if cred, err = gf.credential(g); err != nil {
		return nil, err
	}
	log, err := newLogger("text", logLevel)
	if err != nil {
		return nil, err
	}
	return mcpgate.Open(ctx, mcpgate.OpenConfig{
		ControlPlane: g.addr, Credential: cred, CredentialSource: renewed, GateID: gf.gateID, Upstreams: ups,
		StalenessBudget: gf.staleness, MaxCallsPerNode: gf.maxCalls, OwedReportsFile: gf.owedReports, ConnectTimeout: gf.connect, Stderr: os.Stderr, Logger: log,
	})
}

func newMCPServeCommand(g *globals) *cobra.Command {
	var (
		gf                gateFlags
		uf                upstreamFlags
		listen, publicURL string
		authServers       []string
		logLevel          string
		maxSessions       int
		idleTimeout       time.Duration
		conns             mcpgate.HTTPOptions
	)
	cmd := &cobra.Command{
		Use:   "serve --upstream-cmd NAME='cmd…' | --upstream-url NAME=URL | --config FILE",
		Short: "Serve the gateway as a Streamable HTTP MCP endpoint (bearer: the agent's capability token)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ups, err := uf.upstreams()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			defer ln.Close()
			gw, err := openGateway(ctx, g, &gf, ups, logLevel)
			if err != nil {
				return err
			}
			defer gw.Close()
			base := publicURL
			if base == "" {
				base = "http://" + ln.Addr().String()
			}
			conns.BaseURL, conns.AuthorizationServers, conns.MaxSessionsPerNode, conns.SessionIdleTimeout = base, authServers, maxSessions, idleTimeout
			srv := gw.HTTPServer(conns)
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			fmt.Fprintf(os.Stderr, "tether mcp gateway %q serving %s%s (control plane %s; tools: %s)\n",
				gf.gateID, base, mcpgate.EndpointPath, g.addr, strings.Join(gw.Scopes(), " "))
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7430", "address to serve MCP on")
	f.StringVar(&publicURL, "public-url", "", "the URL agents reach the gateway at, for the protected-resource metadata (default http://<listen>)")
	f.StringArrayVar(&authServers, "authorization-server", nil, "an authorization server to list in the protected-resource metadata; repeatable")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.IntVar(&maxSessions, "max-sessions-per-node", mcpgate.DefaultMaxSessionsPerNode, "MCP sessions one node may keep open on the gateway at once")
	f.DurationVar(&idleTimeout, "session-idle-timeout", mcpgate.DefaultSessionIdleTimeout, "close an MCP session with no request for this long")
	f.DurationVar(&conns.ReadHeaderTimeout, "read-header-timeout", mcpgate.DefaultReadHeaderTimeout, "time to read a request's headers")
	f.DurationVar(&conns.ReadTimeout, "read-timeout", mcpgate.DefaultReadTimeout, "time to read a request's body (the answer, a slow tool's or a stream, has none)")
	f.DurationVar(&conns.IdleTimeout, "idle-timeout", mcpgate.DefaultIdleTimeout, "close a keep-alive connection with no request in flight after this long")
	f.DurationVar(&conns.WriteStallTimeout, "write-stall-timeout", mcpgate.DefaultWriteStallTimeout, "close an agent's connection when one write of its answer is not taken in this long (the answer is dropped)")
	f.IntVar(&conns.MaxHeaderBytes, "max-header-bytes", mcpgate.DefaultMaxHeaderBytes, "largest request headers (431 past it)")
	f.Int64Var(&conns.MaxBodyBytesPerNode, "max-body-bytes-per-node", mcpgate.DefaultMaxBodyBytesPerNode, "bytes of request bodies one node may have held by the gateway at once, each from its first byte read until its request ends (429 and closed past it; negative: no bound)")
	f.IntVar(&conns.MaxConnsPerNode, "max-conns-per-node", 0, "connections one node may hold open to the gateway (429 and closed past it; 0: its --max-calls-per-node and --max-sessions-per-node, and 16 more; negative: no bound)")
	gf.register(f)
	uf.register(f)
	return cmd
}

func newMCPWrapCommand(g *globals) *cobra.Command {
	var (
		gf             gateFlags
		name, logLevel string
		tokenFile      string
	)
	cmd := &cobra.Command{
		Use:   "wrap --name NAME -- COMMAND [ARGS…]",
		Short: "Wrap a stdio MCP server: launch this instead of the server in a framework's MCP config",
		Long: `wrap speaks MCP on stdin/stdout to the framework, and runs COMMAND as the upstream.
The agent's capability token comes from --capability-token-file or $` + envCapabilityTokenFile + `
(re-read whenever the file changes), or from $` + envCapabilityToken + `.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var tokens mcpgate.TokenSource
			switch {
			case tokenFile != "":
				tokens = &mcpgate.FileToken{Path: tokenFile}
			case os.Getenv(envCapabilityTokenFile) != "":
				tokens = &mcpgate.FileToken{Path: os.Getenv(envCapabilityTokenFile)}
			case os.Getenv(envCapabilityToken) != "":
				tokens = mcpgate.StaticToken(os.Getenv(envCapabilityToken))
			default:
				return errors.New("no capability token for the agent: set $" + envCapabilityToken + " or $" + envCapabilityTokenFile + ", or pass --capability-token-file")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			gw, err := openGateway(ctx, g, &gf, []mcpgate.Upstream{{Name: name, Command: args}}, logLevel)
			if err != nil {
				return err
			}
			defer gw.Close()
			return gw.ServeStdio(ctx, tokens, os.Stdin, os.Stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the upstream's name: scopes are mcp:<name>/<tool> (required)")
	f.StringVar(&tokenFile, "capability-token-file", "", "file holding the agent's capability token, re-read when it changes")
	f.StringVar(&logLevel, "log-level", "warn", "log level (logs go to stderr; stdout is the MCP channel)")
	gf.register(f)
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func newMCPToolsCommand(g *globals) *cobra.Command {
	var (
		gf        gateFlags
		uf        upstreamFlags
		tokenFile string
	)
	cmd := &cobra.Command{
		Use:   "tools --capability-token-file FILE --upstream-cmd NAME='cmd…' | --upstream-url NAME=URL | --config FILE",
		Short: "List the tools behind the upstreams and whether a capability token may call each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token := os.Getenv(envCapabilityToken)
			if tokenFile != "" {
				t, err := (&mcpgate.FileToken{Path: tokenFile}).Token()
				if err != nil {
					return err
				}
				token = t
			}
			if token == "" {
				return errors.New("no capability token: pass --capability-token-file or set $" + envCapabilityToken)
			}
			ups, err := uf.upstreams()
			if err != nil {
				return err
			}
			gw, err := openGateway(cmd.Context(), g, &gf, ups, "error")
			if err != nil {
				return err
			}
			defer gw.Close()
			tools, err := gw.Tools(cmd.Context(), token)
			if err != nil {
				return err
			}
			asJSON, err := g.wantJSON()
			if err != nil {
				return err
			}
			if asJSON {
				b, _ := json.MarshalIndent(tools, "", "  ")
				fmt.Fprintln(cmd.OutOrStdout(), string(inertJSON(b)))
				return nil
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "TOOL\tUPSTREAM\tSCOPE\tALLOWED")
			for _, t := range tools {
				allowed := "no"
				if t.Allowed {
					allowed = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Upstream, t.Scope, allowed)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&tokenFile, "capability-token-file", "", "file holding the capability token to check (default: $"+envCapabilityToken+")")
	gf.register(f)
	uf.register(f)
	return cmd
}
