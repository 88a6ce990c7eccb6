package bench

import (
	"context"
	"os"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/embedded"
)

// benchServer is a real control plane on a scratch data directory, served
// over HTTP/2 on loopback, for scenarios that measure end to end.
type benchServer struct {
	*embedded.Server
	Admin *agentsdk.Conn
	dir   string
	// etcdPids are the processes of the etcd members the server's store
	// uses (none on Badger), whose CPU time a measurement may count.
	etcdPids []int
}

// etcdCPU is the CPU time the server's etcd members have used (false when
// there are none, or it cannot be read).
func (b *benchServer) etcdCPU() (time.Duration, bool) {
	var total time.Duration
	for _, pid := range b.etcdPids {
		d, ok := childCPU(pid)
		if !ok {
			return 0, false
		}
		total += d
	}
	return total, len(b.etcdPids) > 0
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

// onServer makes a scenario of measure, run against a fresh server
// (startServer) that is stopped, and its data removed, after.
func onServer(measure func(ctx context.Context, r *Report, srv *benchServer) error) func(context.Context, *Report) error {
	return func(ctx context.Context, r *Report) error {
		srv, err := startServer(ctx, r)
		if err != nil {
			return err
		}
		defer srv.Stop()
		return measure(ctx, r, srv)
	}
}

// Stop stops the server and removes its data.
func (b *benchServer) Stop() {
	b.Server.Stop()
	os.RemoveAll(b.dir)
}
