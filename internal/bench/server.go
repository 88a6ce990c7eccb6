package bench

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
)

// benchServer is a real control plane on a scratch data directory, served
// over HTTP/2 on loopback, for scenarios that measure end to end.
type benchServer struct {
	*controlplane.Server
	URL   string
	Admin *agentsdk.Conn
	stop  func()
}

func startServer(ctx context.Context, r *Report, mutate ...func(*controlplane.Config)) (*benchServer, error) {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-server-*")
	if err != nil {
		return nil, err
	}
	cfg := controlplane.Config{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx, ln) }()
	token, err := os.ReadFile(srv.AdminTokenPath)
	if err != nil {
		cancel()
		return nil, err
	}
	url := "http://" + ln.Addr().String()
	b := &benchServer{Server: srv, URL: url, Admin: agentsdk.Dial(url, strings.TrimSpace(string(token)), nil)}
	b.stop = func() {
		cancel()
		<-done
		srv.Close()
		os.RemoveAll(dir)
	}
	return b, nil
}

func (b *benchServer) Stop() { b.stop() }
