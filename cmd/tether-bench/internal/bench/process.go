package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/freeport"
)

// processServer is the real `tether serve` binary running as a process of
// its own on a scratch data directory (Badger, default durability), for
// comparisons with servers that run as processes of their own (etcd): the
// bench's clients then do not share this process's scheduler, heap and
// garbage collector with the server they measure.
type processServer struct {
	URL   string
	Admin *agentsdk.Conn
	pid   int
	stop  func()
}

func (p *processServer) endpoint() (string, *agentsdk.Conn) { return p.URL, p.Admin }

// cpu is the CPU time of the server process and of this process (the
// bench's clients) together.
func (p *processServer) cpu() (time.Duration, bool) {
	server, ok1 := childCPU(p.pid)
	clients, ok2 := processCPU()
	return server + clients, ok1 && ok2
}

// serverCPU is the CPU time of the server process alone.
func (p *processServer) serverCPU() (time.Duration, bool) { return childCPU(p.pid) }

// buildTether builds cmd/tether into dir.
func buildTether(dir string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the module's source to build cmd/tether")
	}
	bin := filepath.Join(dir, "tether")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/tether")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "..") // the module root, above cmd/tether-bench/internal/bench
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tether: %v\n%s", err, out)
	}
	return bin, nil
}

// startProcessServer builds and runs `tether serve` with args added to the scratch
// data directory and a free loopback port, and waits until it is healthy.
func startProcessServer(ctx context.Context, r *Report, args ...string) (*processServer, error) {
	dir, err := os.MkdirTemp(r.Dir, "tether-bench-process-*")
	if err != nil {
		return nil, err
	}
	bin, err := buildTether(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	logFile, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", filepath.Join(dir, "data"), "--listen", addr, "--log-level", "warn"}, args...)...)
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}
	url := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			stop()
			return nil, fmt.Errorf("tether serve exited during start-up: %s", log)
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("tether serve did not become healthy in 30s")
		}
	}
	token, err := os.ReadFile(filepath.Join(dir, "data", "admin.token"))
	if err != nil {
		stop()
		return nil, err
	}
	return &processServer{URL: url, Admin: agentsdk.Dial(url, strings.TrimSpace(string(token))), pid: cmd.Process.Pid, stop: stop}, nil
}
