package mcpgate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// OpenConfig is what Open needs to run a gateway against a control plane.
type OpenConfig struct {
	// ControlPlane is the control plane's URL.
	ControlPlane string
	// Credential is the gateway's own bearer token: a tool server's token
	// (or an operator token), never an agent's. It writes the ledger and
	// follows the revocation feed. It is opaque here.
	Credential string
	// CredentialSource, when set, gives the gateway's credential at each
	// request to the control plane instead of Credential (a FileToken:
	// rewrite the file with a fresh token before the old one expires). The
	// gateway's cancel orders and revocation feed end when the token they
	// were opened with expires; they reopen with the source's token, the
	// control plane sending again every cancel still pending and the feed
	// resuming after the last revocation applied, so nothing ordered in
	// between is missed. Without it the gateway stops at its credential's
	// expiry: every call refused, calls in flight neither cancelled nor
	// reported.
	CredentialSource TokenSource
	// GateID names the gateway in the ledger and the record.
	GateID string
	// HTTP reaches the control plane (default: agentsdk.HTTP2Client).
	HTTP      *http.Client
	Upstreams []Upstream
	// ReadyTimeout bounds the wait for the revocation feed and the cancel
	// watch (default 15s).
	ReadyTimeout time.Duration
	// StalenessBudget is the Verifier's (default
	// agentsdk.DefaultStalenessBudget).
	StalenessBudget time.Duration
	// MaxCallsPerNode is Config.MaxCallsPerNode.
	MaxCallsPerNode int
	// OwedReportsFile is Config.OwedReportsFile.
	OwedReportsFile string
	// ConnectTimeout is Config.ConnectTimeout: Open fails when an upstream
	// does not answer its connection and first listing within it.
	ConnectTimeout time.Duration
	// Clock is Config.Clock (the gateway's own waits, not the gate's nor
	// the verifier's).
	Clock  clock.Clock
	Stderr io.Writer
	Logger *slog.Logger
}

// Open connects a gateway's parts: a Conn with the gateway's credential,
// its ToolGate, a Verifier following the revocation feed, and the
// upstreams. It returns once the gate follows its cancel orders, the
// verifier has heard the feed, and every upstream listed its tools. Close
// the gateway to stop them all.
func Open(ctx context.Context, cfg OpenConfig) (*Gateway, error) {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 15 * time.Second
	}
	var renew agentsdk.Option
	if cfg.CredentialSource != nil {
		t, err := cfg.CredentialSource.Token()
		if err != nil {
			return nil, fmt.Errorf("mcpgate: the gateway's own credential: %w", err)
		}
		cfg.Credential = t
		renew = agentsdk.WithTokenSource(cfg.CredentialSource.Token)
	}
	if cfg.Credential == "" {
		return nil, fmt.Errorf("mcpgate: the gateway needs its own credential (a tool server's token)")
	}
	if err := validateUpstreams(cfg.Upstreams); err != nil {
		return nil, err
	}
	conn := agentsdk.Dial(cfg.ControlPlane, cfg.Credential, agentsdk.WithHTTPClient(cfg.HTTP), renew)
	verifier, err := agentsdk.NewVerifier(agentsdk.VerifierConfig{Conn: conn, StalenessBudget: cfg.StalenessBudget, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	runCtx, stopVerifier := context.WithCancel(context.WithoutCancel(ctx))
	verifierDone := make(chan struct{})
	go func() { defer close(verifierDone); _ = verifier.Run(runCtx) }()
	gate := agentsdk.NewToolGate(conn, cfg.GateID)
	stop := func() {
		gate.Close()
		stopVerifier()
		<-verifierDone
	}
	timer := time.NewTimer(cfg.ReadyTimeout)
	defer timer.Stop()
	for _, ready := range []struct {
		what string
		ch   <-chan struct{}
	}{{"the revocation feed", verifier.Ready()}, {"the cancel orders", gate.Ready()}} {
		select {
		case <-ready.ch:
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-timer.C:
			stop()
			return nil, fmt.Errorf("mcpgate: the control plane at %s did not send %s within %s (is it up, and is the gateway's credential valid?)", cfg.ControlPlane, ready.what, cfg.ReadyTimeout)
		}
	}
	// An operator's token opens the feed and the cancel orders, and the
	// control plane then refuses every call the gateway records: say so
	// now, not on the first agent's call.
	whoCtx, cancelWho := context.WithTimeout(ctx, cfg.ReadyTimeout)
	who, err := conn.Auth.WhoAmI(whoCtx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	cancelWho()
	if err != nil {
		stop()
		return nil, fmt.Errorf("mcpgate: the control plane at %s did not say whose the gateway's credential is: %w", cfg.ControlPlane, err)
	}
	if p := who.Msg.Principal; !strings.HasPrefix(p, "tool:") {
		stop()
		return nil, fmt.Errorf("mcpgate: the gateway's credential is %s's, not a tool server's: the control plane would refuse every call the gateway records; mint one with tether token create --tool-server %s", p, cfg.GateID)
	}
	g, err := New(Config{Upstreams: cfg.Upstreams, Gate: gate, Verifier: verifier, MaxCallsPerNode: cfg.MaxCallsPerNode, OwedReportsFile: cfg.OwedReportsFile, ConnectTimeout: cfg.ConnectTimeout, Clock: cfg.Clock, Stderr: cfg.Stderr, Logger: cfg.Logger})
	if err != nil {
		stop()
		return nil, err
	}
	if err := g.Start(ctx); err != nil {
		stop()
		return nil, err
	}
	g.stop = stop
	return g, nil
}
