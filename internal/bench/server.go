package bench

import (
	"context"
	"os"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/embedded"
)

// benchServer is a real control plane on a scratch data directory, served
// over HTTP/2 on loopback, for scenarios that measure end to end.
type benchServer struct {
	*embedded.Server
	Admin *agentsdk.Conn
	dir   string
}

func startServer(ctx context.Context, r *Report, mutate ...func(*controlplane.Config)) (*benchServer, error) {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-server-*")
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Start(ctx, dir, mutate...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &benchServer{Server: srv, Admin: agentsdk.Dial(srv.URL, srv.AdminToken), dir: dir}, nil
}

// Stop stops the server and removes its data.
func (b *benchServer) Stop() {
	b.Server.Stop()
	os.RemoveAll(b.dir)
}
