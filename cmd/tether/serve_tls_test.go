package main

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// serveFails runs `tether serve` with args and returns its error output;
// it must exit with an error before serving.
func serveFails(t *testing.T, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(testserver.Binary(t), append([]string{"serve", "--data-dir", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("tether serve %v exited cleanly", args)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("tether serve %v kept running; it should refuse to start", args)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("tether serve %v touched the data directory before refusing: %v", args, err)
	}
	return stderr.String()
}

func TestServeRefusesHalfConfiguredTransport(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	addr := testserver.FreeAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", addr, "--tls-cert", files.ServerCert}, "--tls-key"},
		{[]string{"--listen", addr, "--tls-key", files.ServerKey}, "--tls-cert"},
		{[]string{"--listen", addr, "--tls-client-ca", files.CA}, "needs TLS"},
		{[]string{"--listen", "0.0.0.0:" + strings.Split(addr, ":")[1]}, "--insecure-plaintext"},
	} {
		if got := serveFails(t, tc.args...); !strings.Contains(got, tc.want) {
			t.Fatalf("tether serve %v said %q, want it to name %q", tc.args, got, tc.want)
		}
	}
}

// TestServeWithInsecurePlaintextWarns: the explicit flag starts the server
// on every interface, and says what it means.
func TestServeWithInsecurePlaintextWarns(t *testing.T) {
	dir := t.TempDir()
	port := strings.Split(testserver.FreeAddr(t), ":")[1]
	p := testserver.StartProcessOn(t, dir, "0.0.0.0:"+port, "--insecure-plaintext")
	p.Kill()
	log, err := os.ReadFile(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "serving plaintext on an address other machines can reach") {
		t.Fatalf("no warning in the log:\n%s", log)
	}
}

// TestCLIPresentsAClientCertificate: `tether serve` with mutual TLS, and
// the CLI talking to it with --tls-ca and a client certificate.
func TestCLIPresentsAClientCertificate(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	dir := t.TempDir()
	addr := testserver.FreeAddr(t)
	cmd := exec.Command(testserver.Binary(t), "serve", "--data-dir", dir, "--listen", addr, "--log-level", "warn",
		"--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-client-ca", files.CA)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	url := "https://" + addr
	tlsConfig, err := agentsdk.TLSConfig(files.CA, files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	testserver.WaitFor(t, 30*time.Second, "tether serve with TLS to answer /healthz", func() bool {
		select {
		case <-exited:
			t.Fatalf("tether serve exited: %s", stderr.String())
		default:
		}
		resp, err := hc.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	token, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, url, strings.TrimSpace(string(token)), "whoami",
		"--tls-ca", files.CA, "--tls-client-cert", files.ClientCert, "--tls-client-key", files.ClientKey)
	if !strings.Contains(out, "operator:admin") {
		t.Fatalf("whoami over mutual TLS: %s", out)
	}
	if _, err := cli(t, url, strings.TrimSpace(string(token)), "whoami", "--tls-ca", files.CA); err == nil {
		t.Fatal("the CLI without a client certificate got through")
	}
	// A handshake without a client certificate fails before any HTTP.
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: tlsConfig.RootCAs})
	if err == nil {
		_, err = conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
		if err == nil {
			_, err = conn.Read(make([]byte, 1))
		}
		conn.Close()
	}
	if err == nil {
		t.Fatal("a TLS client without a certificate was answered")
	}
}
