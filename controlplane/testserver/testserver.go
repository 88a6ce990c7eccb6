// Package testserver starts real control planes for tests: in process on a
// real HTTP/2 loopback listener over a Badger data directory, or as the real
// `tether serve` binary in a subprocess (for kill -9 tests).
package testserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/freeport"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Server is a control plane running in the test process.
type Server struct {
	*controlplane.Server
	URL     string
	DataDir string
	Clock   clock.Clock
	Admin   string // the admin token
	HTTP    *http.Client
	cancel  context.CancelFunc
	done    chan error

	connLabel string // the profiler label of the goroutines serving its connections
}

// connLabelKey is the profiler label (runtime/pprof) that marks the
// goroutines serving a test server's connections; its value is the
// server's URL.
const connLabelKey = "tether-testserver-conn"

// labelledListener labels the goroutine that accepts the server's
// connections (http.Server.Serve's) at each Accept. A goroutine is born
// with its creator's labels, so every goroutine serving a connection —
// the connection's own, its streams' handlers, and whatever those start —
// carries the label, and the background components' goroutines (started
// by Run on goroutines of their own) and the test's do not.
type labelledListener struct {
	net.Listener
	labels context.Context
}

func (l labelledListener) Accept() (net.Conn, error) {
	pprof.SetGoroutineLabels(l.labels)
	return l.Listener.Accept()
}

// ConnGoroutines counts the goroutines serving the server's connections
// (labelledListener): what its clients hold of it. Unlike the process's
// goroutine count it leaves out the background components' goroutines,
// whose number changes by itself: on etcd the components start once the
// lease coordinator serves (after the election) and each loop's store
// watches add goroutines of the etcd client as they are established,
// which on a loaded machine is after the server answers its first calls.
func (s *Server) ConnGoroutines() int {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		panic(err)
	}
	// The text format: a record per stack, "<count> @ <pcs>" then, for
	// labelled goroutines, "# labels: {...}".
	want := strconv.Quote(connLabelKey) + ":" + strconv.Quote(s.connLabel)
	n, count := 0, 0
	for line := range strings.Lines(buf.String()) {
		if f := strings.Fields(line); len(f) >= 2 && f[1] == "@" {
			count, _ = strconv.Atoi(f[0])
			continue
		}
		if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, want) {
			n += count
		}
	}
	return n
}

// TerminationChunkEnv, when set, is the chunk size of every test server's
// terminations (controlplane.Config.TerminationChunk): run the termination
// tests with TETHER_TEST_TERMINATION_CHUNK=2 to take every step of them
// through many chunks.
const TerminationChunkEnv = "TETHER_TEST_TERMINATION_CHUNK"

// Option changes the config before the server starts.
type Option func(*controlplane.Config)

// WithClock injects a clock.
func WithClock(c clock.Clock) Option { return func(cfg *controlplane.Config) { cfg.Clock = c } }

// AllowPrivilegeHooks sets the destinations revoke webhooks may call
// (controlplane.Config.PrivilegeHookAllow; `serve --privilege-hook-allow`).
func AllowPrivilegeHooks(entries ...string) Option {
	return func(cfg *controlplane.Config) { cfg.PrivilegeHookAllow = entries }
}

// Start runs a control plane on t.TempDir() and stops it at cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	return StartIn(t, t.TempDir(), opts...)
}

// StartIn runs a control plane on dataDir.
func StartIn(t testing.TB, dataDir string, opts ...Option) *Server {
	t.Helper()
	// Listen first, so that options know the address (cfg.Listen): a
	// replica on etcd publishes it in the leader election.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := controlplane.Config{DataDir: dataDir, Listen: ln.Addr().String(), Logger: testLogger()}
	if o := storeFromEnv(t, dataDir); o != nil {
		opts = append([]Option{o}, opts...)
	}
	if v := os.Getenv(TerminationChunkEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of nodes", TerminationChunkEnv, v)
		}
		cfg.TerminationChunk = n
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		cancel()
		ln.Close()
		t.Fatalf("start control plane: %v", err)
	}
	s := &Server{Server: srv, URL: "http://" + ln.Addr().String(), DataDir: dataDir, Clock: cfg.Clock, HTTP: H2CClient(), cancel: cancel, done: make(chan error, 1)}
	s.connLabel = s.URL
	ln = labelledListener{Listener: ln, labels: pprof.WithLabels(context.Background(), pprof.Labels(connLabelKey, s.connLabel))}
	go func() { s.done <- srv.Run(ctx, ln) }()
	token, err := os.ReadFile(srv.AdminTokenPath)
	if err != nil {
		t.Fatal(err)
	}
	s.Admin = strings.TrimSpace(string(token))
	t.Cleanup(s.Stop)
	return s
}

// Stop shuts the server down and closes its store; safe to call twice.
func (s *Server) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	_ = s.Close()
	s.cancel = nil
}

// H2CClient is an HTTP client speaking HTTP/2 cleartext.
func H2CClient() *http.Client { return agentsdk.HTTP2Client("http://") }

// Clients is one Connect client per service, all with one bearer token:
// the SDK's connection, assembled by agentsdk.Dial.
type Clients = agentsdk.Conn

// NewClients builds clients for baseURL presenting token ("" sends none).
// They retry nothing (agentsdk.WithRetry): a test sees every answer the
// server gives, a rate limit's refusal included.
func NewClients(hc *http.Client, baseURL, token string, opts ...connect.ClientOption) *Clients {
	return agentsdk.Dial(baseURL, token, agentsdk.WithHTTPClient(hc), agentsdk.WithClientOptions(opts...), agentsdk.WithRetry(agentsdk.RetryPolicy{}))
}

// Clients returns clients presenting token.
func (s *Server) Clients(token string) *Clients { return NewClients(s.HTTP, s.URL, token) }

// AdminClients returns clients presenting the admin token.
func (s *Server) AdminClients() *Clients { return s.Clients(s.Admin) }

// WaitFor polls cond until it holds or the deadline passes. It is for
// conditions that another goroutine or process makes true, never a stand-in
// for a fixed sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/tether once per test binary and returns its path. The
// build lands in one directory per checkout under the system's temporary
// directory, replaced atomically by each test binary's build (a running
// server keeps the file it started from), so test runs do not leave a
// binary each behind.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		sum := sha256.Sum256([]byte(root))
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("tether-bin-%x", sum[:8]))
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		tmp, err := os.CreateTemp(dir, "tether-*.building")
		if err != nil {
			buildErr = err
			return
		}
		_ = tmp.Close()
		defer func() { _ = os.Remove(tmp.Name()) }()
		cmd := exec.Command("go", "build", "-o", tmp.Name(), "./cmd/tether")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		binPath = filepath.Join(dir, "tether")
		buildErr = os.Rename(tmp.Name(), binPath)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Process is `tether serve` running as a subprocess.
type Process struct {
	URL     string
	DataDir string
	Admin   string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// StartProcess runs the real binary on dataDir and waits until it is healthy.
func StartProcess(t testing.TB, dataDir string, extraArgs ...string) *Process {
	t.Helper()
	return StartProcessOn(t, dataDir, FreeAddr(t), extraArgs...)
}

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a process to listen on (again after a restart), below the
// kernel's ephemeral range where there is room (internal/freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// StartProcessOn is StartProcess listening on addr, so that a server
// restarted after Kill keeps its address and long-lived clients (tool
// gates, sessions, verifiers) reconnect to it by themselves.
func StartProcessOn(t testing.TB, dataDir, addr string, extraArgs ...string) *Process {
	t.Helper()
	return startProcess(t, dataDir, addr, 0, extraArgs...)
}

// StartProcessWithFileLimit is StartProcess with the process's open-file
// limit (ulimit -n, soft and hard) set to files.
func StartProcessWithFileLimit(t testing.TB, dataDir string, files int, extraArgs ...string) *Process {
	t.Helper()
	return startProcess(t, dataDir, FreeAddr(t), files, extraArgs...)
}

func startProcess(t testing.TB, dataDir, addr string, files int, extraArgs ...string) *Process {
	t.Helper()
	bin := Binary(t)
	args := append([]string{"serve", "--data-dir", dataDir, "--listen", addr, "--log-level", "warn"}, extraArgs...)
	cmd := exec.Command(bin, args...)
	if files > 0 {
		// Go raises the soft limit to the hard one at start, so both.
		cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, files), bin}, args...)...)
	}
	cmd.Stdout = io.Discard
	// The server's log (warnings and errors) goes to <data-dir>/serve.log,
	// appended across restarts, for the test to show when it fails.
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dataDir, "serve.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatal(err)
	}
	p := &Process{URL: "http://" + addr, DataDir: dataDir, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.exited) }()
	t.Cleanup(func() { p.Kill() })
	hc := H2CClient()
	WaitFor(t, 30*time.Second, "tether serve to become healthy", func() bool {
		select {
		case <-p.exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("tether serve exited early; its log:\n%s", tail(log, 4096))
		default:
		}
		resp, err := hc.Get(p.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	token, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	p.Admin = strings.TrimSpace(string(token))
	return p
}

// Exited is closed when the process has exited (killed, or by itself).
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	if p.cmd.Process == nil {
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return
	}
	<-p.exited
}

// Signal sends sig to the process (SIGSTOP freezes it mid-stream, as a
// replica stalled by its machine; SIGCONT lets it run on).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Clients returns clients for the process.
func (p *Process) Clients(token string) *Clients { return NewClients(H2CClient(), p.URL, token) }

// ToolServerToken has an admin mint a tool server's token named name (its
// gate id) through AuthService.CreateToken: the credential a ToolGate
// reports tool calls with.
func ToolServerToken(t testing.TB, admin *Clients, name string) string {
	t.Helper()
	resp, err := admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: name}))
	if err != nil {
		t.Fatalf("mint tool-server token %s: %v", name, err)
	}
	return resp.Msg.Token
}

// ToolServerToken mints a tool server's token named name.
func (s *Server) ToolServerToken(t testing.TB, name string) string {
	t.Helper()
	return ToolServerToken(t, s.AdminClients(), name)
}

// ToolServerToken mints a tool server's token named name.
func (p *Process) ToolServerToken(t testing.TB, name string) string {
	t.Helper()
	return ToolServerToken(t, p.Clients(p.Admin), name)
}

// LogEnv, when set, sends every test server's log, debug lines included,
// to the test binary's stderr: run a failing test with TETHER_TEST_LOG=1 to
// see what the server did (it is silent otherwise).
const LogEnv = "TETHER_TEST_LOG"

func testLogger() *slog.Logger {
	if os.Getenv(LogEnv) == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
