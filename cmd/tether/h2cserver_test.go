package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// serveH2C serves h on loopback over HTTP/1.1 and unencrypted HTTP/2 (the
// CLI dials h2c) until the test ends, and returns its URL: a rogue path
// the CLI is pointed at in front of the real server.
func serveH2C(t *testing.T, h http.Handler) string {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL
}
