// Package embedded runs a real control plane inside the current process —
// Badger on a data directory, Connect over HTTP/2 on a loopback port — for
// the demo, the benchmarks and the agentsdk examples. Tests use
// controlplane/testserver, which adds testing.TB conveniences on top.
package embedded

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/tetherhq/tether/controlplane"
)

// Server is an embedded control plane.
type Server struct {
	*controlplane.Server
	// URL is the base URL, http://127.0.0.1:<port>.
	URL string
	// AdminToken is the bootstrap admin token.
	AdminToken string
	stop       func()
}

// Start serves a control plane on dataDir (created if needed) until Stop.
// Logs are discarded unless cfg sets a logger.
func Start(ctx context.Context, dataDir string, mutate ...func(*controlplane.Config)) (*Server, error) {
	// Listen first, so that mutate knows the address (cfg.Listen): a
	// replica on etcd publishes it in the leader election.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cfg := controlplane.Config{DataDir: dataDir, Listen: ln.Addr().String(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx, ln) }()
	token, err := os.ReadFile(srv.AdminTokenPath)
	if err != nil {
		cancel()
		<-done
		srv.Close()
		return nil, err
	}
	return &Server{
		Server:     srv,
		URL:        "http://" + ln.Addr().String(),
		AdminToken: strings.TrimSpace(string(token)),
		stop: func() {
			cancel()
			<-done
			srv.Close()
		},
	}, nil
}

// Stop shuts the server down gracefully and closes its store.
func (s *Server) Stop() { s.stop() }
