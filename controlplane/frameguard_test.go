package controlplane

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestFrameGuardKeepsTheRequestsTLSState: HTTP/2 over TLS is served
// through the guard as cleartext HTTP/2 over the TLS connection; a
// request still sees its TLS state (the console marks its cookie Secure
// by it).
func TestFrameGuardKeepsTheRequestsTLSState(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Unix(0, 0), NotAfter: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	sawTLS := make(chan bool, 1)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sawTLS <- r.TLS != nil && r.ProtoMajor == 2
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	srv.Protocols = p
	if err := guardHTTP2(srv); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("served %s, want HTTP/2", resp.Proto)
	}
	if !<-sawTLS {
		t.Fatal("the request over HTTP/2 and TLS had no TLS state")
	}
}

// TestFrameScannerCountsPingsAcrossReads: the scanner follows frames
// whatever the reads' boundaries, counts only the PINGs of its direction,
// and cuts at the end of the frame that fills its room.
func TestFrameScannerCountsPingsAcrossReads(t *testing.T) {
	var wire bytes.Buffer
	fr := http2.NewFramer(&wire, nil)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	_ = fr.WritePing(true, [8]byte{}) // an ACK: not counted coming in
	for i := range 5 {
		_ = fr.WritePing(false, [8]byte{byte(i)})
		_ = fr.WriteData(1, false, make([]byte, i*7))
	}
	all := wire.Bytes()
	// A byte at a time: 5 PINGs, nothing cut.
	var s frameScanner
	pings := 0
	for i := range all {
		k, n := s.scan(all[i:i+1], 10)
		if k != 1 {
			t.Fatalf("byte %d: handed on %d of 1", i, k)
		}
		pings += n
	}
	if pings != 5 {
		t.Fatalf("counted %d PINGs, want 5", pings)
	}
	// With room for 2: cut right after the second PING's payload.
	var s2 frameScanner
	k, n := s2.scan(all, 2)
	if n != 2 {
		t.Fatalf("counted %d PINGs with room for 2", n)
	}
	var rest frameScanner
	k2, n2 := rest.scan(all[k:], -1)
	if k2 != len(all)-k || n2 != 3 {
		t.Fatalf("the rest after the cut: %d bytes, %d PINGs; want %d, 3 (cut mid-frame?)", k2, n2, len(all)-k)
	}
	// Going out, only the acknowledgements count.
	out := frameScanner{out: true}
	if _, n := out.scan(all, -1); n != 1 {
		t.Fatalf("counted %d acknowledgements out, want 1", n)
	}
}

// TestLimitedOfSeesThroughTheGuard: Go's HTTP/2 server reports a
// connection's state with the connection it serves, now the guard; the
// limiter still finds its connection under it (an unauthenticated
// connection's request in flight gets its grace), in cleartext and over TLS.
func TestLimitedOfSeesThroughTheGuard(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	lc := &limitedConn{Conn: a}
	if got := limitedOf(newFrameGuard(lc)); got != lc {
		t.Fatal("the cleartext guard hid its connection")
	}
	tc := tls.Server(lc, &tls.Config{})
	if got := limitedOf(&tlsFrameGuard{newFrameGuard(tc), tc}); got != lc {
		t.Fatal("the TLS guard hid its connection")
	}
}
