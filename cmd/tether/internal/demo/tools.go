package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tetherhq/tether/agentsdk"
)

// toolServer is a tool served over loopback behind a ToolGate.
type toolServer struct {
	name string
	url  string
	gate *agentsdk.ToolGate
	srv  *http.Server

	mu      sync.Mutex
	started map[string]chan struct{} // call tags whose handler has started
}

// startToolServer serves handler as tool `name` on a loopback port.
func startToolServer(name string, gate *agentsdk.ToolGate, handler func(t *toolServer, w http.ResponseWriter, r *http.Request)) (*toolServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &toolServer{name: name, url: "http://" + ln.Addr().String(), gate: gate, started: map[string]chan struct{}{}}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler(t, w, r) })
	t.srv = &http.Server{Handler: gate.Middleware(name, inner), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

func (t *toolServer) close() {
	_ = t.srv.Close()
	t.gate.Close()
}

// startedChan returns the channel closed when the call tagged tag starts.
func (t *toolServer) startedChan(tag string) chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch, ok := t.started[tag]
	if !ok {
		ch = make(chan struct{})
		t.started[tag] = ch
	}
	return ch
}

func (t *toolServer) markStarted(tag string) {
	if tag == "" {
		return
	}
	ch := t.startedChan(tag)
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// shellHandler simulates running a command for duration_ms, stopping early
// when the gate cancels the call.
func shellHandler(t *toolServer, w http.ResponseWriter, r *http.Request) {
	ms, _ := strconv.Atoi(r.URL.Query().Get("duration_ms"))
	t.markStarted(r.URL.Query().Get("tag"))
	timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer timer.Stop()
	select {
	case <-timer.C:
		_ = json.NewEncoder(w).Encode(map[string]any{"exit_code": 0, "stdout": "ok: " + r.URL.Query().Get("cmd")})
	case <-r.Context().Done():
		// The gate cancelled the call: stop the "process" and return.
	}
}

// fetchHandler performs a real HTTP request to the upstream (a loopback
// stand-in for the internet) and returns what it got.
func fetchHandler(upstream string) func(t *toolServer, w http.ResponseWriter, r *http.Request) {
	client := &http.Client{Timeout: 10 * time.Second}
	return func(t *toolServer, w http.ResponseWriter, r *http.Request) {
		t.markStarted(r.URL.Query().Get("tag"))
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, upstream+"/doc?q="+r.URL.Query().Get("q"), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			return // cancelled or upstream down: the gate reports it
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": resp.StatusCode, "bytes": len(body)})
	}
}

// startUpstream is the "internet": documents served with real latency.
func startUpstream(latency time.Duration) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/revoke" {
			// The owner of locks and rate-limit tokens: revocation webhooks land here.
			w.WriteHeader(http.StatusNoContent)
			return
		}
		select {
		case <-time.After(latency):
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "document about %s\n", r.URL.Query().Get("q"))
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// callTool calls a tool server with a capability token.
func callTool(ctx context.Context, hc *http.Client, url, token string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(agentsdk.CapabilityHeader, token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
