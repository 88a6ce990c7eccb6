package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/supervisor"
)

func newServeCommand(g *globals) *cobra.Command {
	var (
		listen, tlsCert, tlsKey, logFormat, logLevel string
		rateLimit                                    float64
		ruleActions                                  []string
		storage                                      storeFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane (Connect, gRPC and gRPC-Web on one port)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cfg := controlplane.Config{
				DataDir: g.dataDir, Listen: listen, TLSCert: tlsCert, TLSKey: tlsKey, Logger: log, RateLimit: rateLimit,
			}
			if point := os.Getenv(crashStopRuleEnv); point != "" {
				cfg.StopRuleFault = crashAt(point)
			}
			for _, s := range ruleActions {
				a, err := supervisor.ParseRuleAction(s)
				if err != nil {
					return fmt.Errorf("--stop-rule-action: %w", err)
				}
				cfg.StopPolicy.RuleActions = append(cfg.StopPolicy.RuleActions, a)
			}
			// Listen first: the replica publishes the address it serves on
			// in the leader election (--advertise-url).
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			defer ln.Close()
			scheme := "http"
			if tlsCert != "" {
				scheme = "https"
			}
			closeStore, err := storage.apply(ctx, &cfg, log, scheme, ln.Addr())
			if err != nil {
				return err
			}
			defer closeStore()
			srv, err := controlplane.New(ctx, cfg)
			if err != nil {
				return err
			}
			defer srv.Close()
			log.Info("tether serving", "addr", scheme+"://"+ln.Addr().String(), "data_dir", g.dataDir, "store", storage.kind, "admin_token", srv.AdminTokenPath)
			fmt.Fprintf(os.Stderr, "admin token: %s\n", srv.AdminTokenPath)
			return srv.Run(ctx, ln)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7420", "address to listen on")
	f.StringVar(&tlsCert, "tls-cert", "", "TLS certificate file (enables TLS with --tls-key)")
	f.StringVar(&tlsKey, "tls-key", "", "TLS private key file")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	storage.register(f)
	f.StringArrayVar(&ruleActions, "stop-rule-action", nil, "start a termination at once for the stop proposals of matching stop rules: drain:<match> or abort:<match>, where <match> is severity=<s>, label:<k=v,...> or * (repeatable; the first match wins; unmatched proposals wait for an operator)")
	f.Float64Var(&rateLimit, "rate-limit", 2000, "requests per second per caller (bursts of twice that); 0 disables")
	return cmd
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

// crashStopRuleEnv names a fault point of the stop-rule evaluator
// ("before-file", "after-file") at which the process kills itself with
// SIGKILL: for the kill -9 tests of internal/testserver's subprocess mode,
// never for production.
const crashStopRuleEnv = "TETHER_TEST_CRASH_STOP_RULE"

func crashAt(point string) func(string) error {
	return func(p string) error {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL cannot be caught: nothing after this runs
		}
		return nil
	}
}
