package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// clients is one Connect client per service, assembled by agentsdk.Dial.
type clients = agentsdk.Conn

// httpClient speaks HTTP/2 to the control plane: cleartext (h2c) for http://
// addresses, TLS for https:// (with --tls-ca and a client certificate when
// given).
func (g *globals) httpClient() (*http.Client, error) {
	if g.tlsCA == "" && g.tlsClientCert == "" && g.tlsClientKey == "" {
		return agentsdk.HTTP2Client(g.addr), nil
	}
	cfg, err := agentsdk.TLSConfig(g.tlsCA, g.tlsClientCert, g.tlsClientKey)
	if err != nil {
		return nil, err
	}
	return agentsdk.HTTP2ClientTLS(g.addr, cfg), nil
}

func (g *globals) resolveToken() (string, error) {
	if g.token != "" {
		return g.token, nil
	}
	if v := os.Getenv("TETHER_TOKEN"); v != "" {
		return v, nil
	}
	file := g.tokenFile
	if file == "" && isLocal(g.addr) {
		file = filepath.Join(g.dataDir, "admin.token")
	}
	if file == "" {
		return "", errors.New("no token: pass --token or --token-file, or set TETHER_TOKEN")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func isLocal(addr string) bool {
	u, err := url.Parse(addr)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (g *globals) clients() (*clients, error) {
	token, err := g.resolveToken()
	if err != nil {
		return nil, err
	}
	hc, err := g.httpClient()
	if err != nil {
		return nil, err
	}
	return agentsdk.Dial(g.addr, token, agentsdk.WithHTTPClient(hc)), nil
}

// printJSON writes a message as indented protojson (the same shape curl sees).
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// printJSONList writes messages as a JSON array.
func printJSONList[M proto.Message](w io.Writer, ms []M) error {
	raw := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		raw = append(raw, b)
	}
	b, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func (g *globals) wantJSON() (bool, error) {
	switch g.output {
	case "json":
		return true, nil
	case "table", "":
		return false, nil
	default:
		return false, fmt.Errorf("-o %q: want table or json", g.output)
	}
}
