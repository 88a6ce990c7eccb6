// Package etcdlocal runs etcd members as child processes on loopback, for
// tests (through internal/etcdtest) and benchmarks: a single member or a
// small cluster, each with a data directory of its own, on free ports,
// started with the flags Tether's store needs (StoreFlags), and ready when
// Start returns — every member answers /health, which requires a leader.
//
// It runs the etcd binary found by Binary: $TETHER_ETCD_BIN, else etcd on
// the PATH (Debian's etcd-server package installs /usr/bin/etcd).
package etcdlocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetherhq/tether/internal/freeport"
	"github.com/tetherhq/tether/internal/store/etcdstore"
)

// BinaryEnv names the environment variable that points at the etcd binary.
const BinaryEnv = "TETHER_ETCD_BIN"

// ErrNoBinary is returned by Binary and Start when there is no etcd binary.
var ErrNoBinary = errors.New("etcdlocal: no etcd binary: install etcd (Debian: apt-get install etcd-server) or set " + BinaryEnv)

// StoreFlags are the flags every etcd member serving Tether's store needs:
// the control plane commits a whole subtree in one transaction, far more
// than etcd's defaults allow (128 operations, 1.5 MiB per request).
var StoreFlags = []string{
	"--max-txn-ops=" + strconv.Itoa(etcdstore.EtcdMaxTxnOps),
	"--max-request-bytes=" + strconv.Itoa(etcdstore.EtcdMaxRequestBytes),
}

// Config describes the members to start.
type Config struct {
	// Dir holds each member's data directory and log. Required.
	Dir string
	// Members is the number of members; default 1.
	Members int
	// Flags are passed to every member; nil means StoreFlags. Pass an
	// empty, non-nil slice for etcd's defaults.
	Flags []string
	// StartTimeout bounds the wait until every member is healthy; default
	// 30s.
	StartTimeout time.Duration
}

// Cluster is a running set of members.
type Cluster struct {
	Members []*Member
}

// Endpoints returns the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	urls := make([]string, len(c.Members))
	for i, m := range c.Members {
		urls[i] = m.ClientURL
	}
	return urls
}

// Stop stops every member (SIGTERM, then SIGKILL after a grace period).
// Stopped members are skipped; it is safe to call twice.
func (c *Cluster) Stop() error {
	var errs []error
	for _, m := range c.Members {
		errs = append(errs, m.Stop())
	}
	return errors.Join(errs...)
}

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	// Dir is the member's data directory; its log is Dir + ".log".
	Dir string

	binary string
	args   []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// Binary returns the path of the etcd binary, or ErrNoBinary.
func Binary() (string, error) {
	if path := os.Getenv(BinaryEnv); path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNoBinary, BinaryEnv, path, err)
		}
		return path, nil
	}
	path, err := exec.LookPath("etcd")
	if err != nil {
		return "", ErrNoBinary
	}
	return path, nil
}

// startAttempts is how often Start tries fresh ports when a member could
// not bind the ones it was given (another process took them between our
// probe and etcd's bind).
const startAttempts = 3

// Start starts the members and waits until each answers /health. On error
// it stops whatever it started.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("etcdlocal: Config.Dir is required")
	}
	if cfg.Members <= 0 {
		cfg.Members = 1
	}
	if cfg.Flags == nil {
		cfg.Flags = StoreFlags
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	binary, err := Binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := range startAttempts {
		dir := filepath.Join(cfg.Dir, fmt.Sprintf("etcd-%d", attempt))
		c, err := start(ctx, binary, dir, cfg)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil || !errors.Is(err, errAddressInUse) {
			break
		}
	}
	return nil, lastErr
}

var errAddressInUse = errors.New("address already in use")

func start(ctx context.Context, binary, dir string, cfg Config) (*Cluster, error) {
	ports, err := freeport.Ports(2 * cfg.Members)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	var initial []string
	for i := range cfg.Members {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			binary:    binary,
		}
		m.Dir = filepath.Join(dir, m.Name)
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	token := fmt.Sprintf("tether-%d-%d", os.Getpid(), time.Now().UnixNano())
	for _, m := range c.Members {
		m.args = append([]string{
			"--name", m.Name,
			"--data-dir", m.Dir,
			"--listen-client-urls", m.ClientURL,
			"--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL,
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--logger", "zap",
			"--log-outputs", "stderr",
			"--log-level", "warn",
		}, cfg.Flags...)
		if err := os.MkdirAll(filepath.Dir(m.Dir), 0o700); err != nil {
			c.Stop()
			return nil, err
		}
		if err := m.launch(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	for _, m := range c.Members {
		if err := m.WaitHealthy(waitCtx); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// launch starts the member's process with its log appended to Dir.log.
func (m *Member) launch() error {
	log, err := os.OpenFile(m.Dir+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.binary, m.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = environment()
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("etcdlocal: start %s: %w", m.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(exited)
	}()
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	return nil
}

// environment is ours without ETCD_* variables, which etcd would read as
// flags.
func environment() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// WaitHealthy waits until the member answers /health with a leader, or
// fails as soon as its process exits.
func (m *Member) WaitHealthy(ctx context.Context) error {
	m.mu.Lock()
	exited := m.exited
	m.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = m.health(ctx, client); last == nil {
			return nil
		}
		select {
		case <-exited:
			return m.failure("exited while starting", nil)
		case <-ctx.Done():
			return m.failure("not healthy in time", last)
		case <-tick.C:
		}
	}
}

func (m *Member) health(ctx context.Context, client *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.ClientURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
		return fmt.Errorf("/health: %s %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// failure describes a member that did not start, with the end of its log.
func (m *Member) failure(what string, cause error) error {
	tail := m.LogTail(2048)
	err := fmt.Errorf("etcdlocal: member %s (%s) %s", m.Name, m.ClientURL, what)
	if cause != nil {
		err = fmt.Errorf("%w: %v", err, cause)
	}
	if strings.Contains(tail, "address already in use") {
		err = fmt.Errorf("%w (%w)", err, errAddressInUse)
	}
	return fmt.Errorf("%w\n--- end of %s.log ---\n%s", err, m.Dir, tail)
}

// LogTail returns up to n bytes from the end of the member's log.
func (m *Member) LogTail(n int) string {
	data, err := os.ReadFile(m.Dir + ".log")
	if err != nil {
		return err.Error()
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}

// Running reports whether the member's process is running.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// Pid returns the process id of the member's running process, 0 when it
// is not running (benchmarks read its CPU time).
func (m *Member) Pid() int {
	if !m.Running() {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Kill ends the member with SIGKILL, as a crash would, and waits for it.
func (m *Member) Kill() error {
	return m.signalAndWait(syscall.SIGKILL, 0)
}

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Stop ends the member with SIGTERM, or SIGKILL if it is still running
// after a grace period.
func (m *Member) Stop() error {
	return m.signalAndWait(syscall.SIGTERM, stopGrace)
}

func (m *Member) signalAndWait(sig syscall.Signal, grace time.Duration) error {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("etcdlocal: signal %s: %w", m.Name, err)
	}
	if grace > 0 {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-exited:
			return nil
		case <-timer.C:
			_ = cmd.Process.Kill()
		}
	}
	<-exited
	return nil
}

// Restart starts a stopped or killed member again on its data directory
// and ports, and waits until it is healthy.
func (m *Member) Restart(ctx context.Context) error {
	if m.Running() {
		return fmt.Errorf("etcdlocal: member %s is running", m.Name)
	}
	if err := m.launch(); err != nil {
		return err
	}
	return m.WaitHealthy(ctx)
}
