package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// CheckTransport refuses a half-configured TLS, and plaintext on an address
// other machines can reach unless InsecurePlaintext says so (then it
// warns). It runs at start, before anything listens or is written.
func (c *Config) CheckTransport() error {
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		return errors.New("controlplane: a TLS certificate (--tls-cert) needs its private key (--tls-key)")
	case c.TLSCert == "" && c.TLSKey != "":
		return errors.New("controlplane: a TLS private key (--tls-key) needs its certificate (--tls-cert)")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("controlplane: verifying client certificates (--tls-client-ca) needs TLS (--tls-cert and --tls-key)")
	}
	if c.TLSCert != "" {
		_, err := c.serverTLS()
		return err
	}
	if !loopback(c.Listen) && !c.InsecurePlaintext {
		return fmt.Errorf("controlplane: refusing to serve plaintext on %s, which other machines can reach: configure TLS (--tls-cert and --tls-key), listen on a loopback address, or pass --insecure-plaintext when something in front (a service mesh, a TLS-terminating proxy) protects the traffic", c.Listen)
	}
	return nil
}

// loopback reports whether addr ("host:port") is reachable only from this
// machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// peerTLS is the TLS a replica uses to forward calls to the leader: PeerTLS,
// and when the replicas require client certificates (TLSClientCA), this
// replica's own certificate presented as the client's — it must then allow
// client authentication (extended key usage clientAuth).
func (c *Config) peerTLS() *tls.Config {
	if c.TLSClientCA == "" || c.TLSCert == "" {
		return c.PeerTLS
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.PeerTLS != nil {
		cfg = c.PeerTLS.Clone()
	}
	certFile, keyFile := c.TLSCert, c.TLSKey
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		return &cert, err
	}
	return cfg
}

// serverTLS loads the certificate and, with TLSClientCA, requires every
// client to present a certificate that CA signed.
func (c *Config) serverTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("controlplane: tls: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCA != "" {
		pem, err := os.ReadFile(c.TLSClientCA)
		if err != nil {
			return nil, fmt.Errorf("controlplane: tls client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("controlplane: tls client CA %s holds no PEM certificate", c.TLSClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
