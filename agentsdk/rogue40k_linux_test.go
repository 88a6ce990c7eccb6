package agentsdk_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// runningAtConfirm notes, at the launcher's first ConfirmExit, how many of
// the processes whose pids are in dir still exist.
type runningAtConfirm struct {
	base    http.RoundTripper
	dir     string
	once    sync.Once
	running int
	of      int
}

func (r *runningAtConfirm) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/ConfirmExit") {
		r.once.Do(func() {
			entries, _ := os.ReadDir(r.dir)
			r.of = len(entries)
			for _, e := range entries {
				if _, err := os.Stat(filepath.Join("/proc", e.Name())); err == nil {
					r.running++
				}
			}
		})
	}
	return r.base.RoundTrip(req)
}

// TestRogue40KShutdownWaitsOneKillGraceForAllItsProcesses: a rogue agent
// deaf to SIGTERM and to its drain runs on after its launcher drained it
// for a new version, and the new version is as deaf. The launcher's
// shutdown sent SIGTERM to every process, then waited for each in turn,
// up to KillGrace each, the next one's wait beginning only once the one
// before was killed and its exit confirmed: each such process added a
// KillGrace to the shutdown, its credential alive until then. The wait is
// now one KillGrace for them all: every process is killed (and reaped)
// before the first exit is confirmed.
func TestRogue40KShutdownWaitsOneKillGraceForAllItsProcesses(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	seen := &runningAtConfirm{base: srv.HTTP.Transport, dir: dir}
	l, err := agentsdk.NewLauncher(agentsdk.LauncherConfig{
		Operator: agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(&http.Client{Transport: seen})),
		Name:     "deaf", Versions: helperVersions("TETHER_LAUNCHER_HELPER_STUBBORN=" + dir),
		Start: "v1", PollEvery: 20 * time.Millisecond, KillGrace: 2 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTarget("v2"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	admin := srv.AdminClients()
	var v1 string
	testserver.WaitFor(t, 30*time.Second, "the v1 process to report ready", func() bool {
		v1, _ = l.Current()
		return v1 != "" && getNode(t, admin, v1).ReadyAt != nil
	})
	if _, err := admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: v1, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "rogue40k: the new version",
		DrainWindow: durationpb.New(time.Hour), ConfirmTimeout: durationpb.New(time.Hour),
	})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the v2 replacement to report ready", func() bool {
		node, version := l.Current()
		return version == "v2" && getNode(t, admin, node).ReadyAt != nil
	})
	testserver.WaitFor(t, 30*time.Second, "both processes to run", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 2
	})
	cancel()
	<-done
	done <- nil
	if seen.of != 2 || seen.running != 0 {
		t.Fatalf("at the launcher's first confirmed exit, %d of %d processes deaf to SIGTERM still ran, each waiting a KillGrace of its own", seen.running, seen.of)
	}
}
