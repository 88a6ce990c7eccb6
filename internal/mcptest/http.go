package mcptest

import (
	"net"
	"net/http"
)

// ServeLoopback serves, on a fresh loopback port, the handler that handler
// builds for its own base URL (a gateway's handler needs it); stop closes
// the server.
func ServeLoopback(handler func(baseURL string) http.Handler) (baseURL string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	baseURL = "http://" + ln.Addr().String()
	s := &http.Server{Handler: handler(baseURL)}
	go func() { _ = s.Serve(ln) }()
	return baseURL, func() { _ = s.Close() }, nil
}

// Bearer is an HTTP transport that presents Token as a bearer credential
// (an agent's capability token, for a client of the MCP gateway); an
// empty Token sends none. Next is the transport beneath
// (http.DefaultTransport when nil).
type Bearer struct {
	Token string
	Next  http.RoundTripper
}

func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	next := b.Next
	if next == nil {
		next = http.DefaultTransport
	}
	if b.Token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.Token)
	}
	return next.RoundTrip(r)
}
