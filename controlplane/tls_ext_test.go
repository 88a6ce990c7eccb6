package controlplane_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serveOn starts a control plane of cfg (its data in a new temporary
// directory, listening at ln's address, logging nothing) serving ln until
// the test ends, and returns it, the context it runs under and the
// operator's token.
func serveOn(t *testing.T, ln net.Listener, cfg controlplane.Config) (*controlplane.Server, context.Context, string) {
	t.Helper()
	cfg.DataDir, cfg.Listen, cfg.Logger = t.TempDir(), ln.Addr().String(), quietLogger()
	srv, err := controlplane.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	admin, err := os.ReadFile(srv.AdminTokenPath)
	if err != nil {
		t.Fatal(err)
	}
	return srv, ctx, strings.TrimSpace(string(admin))
}

func TestHalfConfiguredTransportIsRefused(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	for _, tc := range []struct {
		name string
		cfg  controlplane.Config
		want string
	}{
		{"certificate without key", controlplane.Config{TLSCert: files.ServerCert}, "needs its private key (--tls-key)"},
		{"key without certificate", controlplane.Config{TLSKey: files.ServerKey}, "needs its certificate (--tls-cert)"},
		{"client CA without TLS", controlplane.Config{TLSClientCA: files.CA}, "needs TLS"},
		{"a certificate that is not one", controlplane.Config{TLSCert: files.CA, TLSKey: files.ServerKey}, "tls"},
		{"a client CA file without a certificate in it", controlplane.Config{TLSCert: files.ServerCert, TLSKey: files.ServerKey, TLSClientCA: files.ServerKey}, "holds no PEM certificate"},
		{"plaintext on every interface", controlplane.Config{Listen: "0.0.0.0:7420"}, "--insecure-plaintext"},
		{"plaintext on an empty host", controlplane.Config{Listen: ":7420"}, "refusing to serve plaintext"},
		{"plaintext on a routable address", controlplane.Config{Listen: "10.1.2.3:7420"}, "refusing to serve plaintext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir() + "/data"
			tc.cfg.DataDir, tc.cfg.Logger = dir, quietLogger()
			srv, err := controlplane.New(context.Background(), tc.cfg)
			if err == nil {
				srv.Close()
				t.Fatalf("started with %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
				t.Fatalf("a refused start touched the data directory: %v", statErr)
			}
		})
	}
	// Plaintext on a reachable address with the explicit flag starts.
	srv, err := controlplane.New(context.Background(), controlplane.Config{DataDir: t.TempDir(), Listen: "0.0.0.0:7420", InsecurePlaintext: true, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("with InsecurePlaintext: %v", err)
	}
	srv.Close()
}

// TestMutualTLS: with a client CA, only clients presenting a certificate
// it signed get through the handshake, and they still need a token.
func TestMutualTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, _, admin := serveOn(t, ln, controlplane.Config{
		TLSCert: files.ServerCert, TLSKey: files.ServerKey, TLSClientCA: files.CA,
	})
	url := "https://" + ln.Addr().String()
	call := func(caFile, cert, key, token string) error {
		cfg, err := agentsdk.TLSConfig(caFile, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		conn := agentsdk.Dial(url, token, agentsdk.WithHTTPClient(agentsdk.HTTP2ClientTLS(url, cfg)))
		_, err = conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		return err
	}
	token := admin
	if err := call(files.CA, files.ClientCert, files.ClientKey, token); err != nil {
		t.Fatalf("a client with a certificate of the CA: %v", err)
	}
	if err := call(files.CA, files.ClientCert, files.ClientKey, ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a certificate is not a credential: %v, want unauthenticated", err)
	}
	if err := call(files.CA, files.StrangerCert, files.StrangerKey, token); err == nil {
		t.Fatal("a client with a certificate of another CA got through")
	}
	// Unary calls over HTTP/1.1 (agentsdk.UnaryHTTP1Client) present the
	// client certificate too, and a stranger's is refused the same way.
	viaHTTP1 := func(cert, key string) error {
		cfg, err := agentsdk.TLSConfig(files.CA, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		conn := agentsdk.Dial(url, token, agentsdk.WithHTTPClient(agentsdk.UnaryHTTP1Client(url, cfg, 1)))
		_, err = conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		return err
	}
	if err := viaHTTP1(files.ClientCert, files.ClientKey); err != nil {
		t.Fatalf("a unary call over HTTP/1.1 with a certificate of the CA: %v", err)
	}
	if err := viaHTTP1(files.StrangerCert, files.StrangerKey); err == nil {
		t.Fatal("a unary call over HTTP/1.1 with a certificate of another CA got through")
	}
	if err := call(files.CA, "", "", token); err == nil {
		t.Fatal("a client without a certificate got through")
	}
	// Plaintext HTTP/2 to a TLS port is not served either.
	plain := agentsdk.Dial("http://"+ln.Addr().String(), token)
	if _, err := plain.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err == nil {
		t.Fatal("a plaintext client was served on the TLS port")
	}
}
