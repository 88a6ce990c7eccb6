package agentsdk

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel/propagation"

	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// Conn is a connection to the control plane presenting one bearer token
// (an operator token or an agent credential). The token can be replaced
// (credential refresh) while calls are in flight. It follows no redirect
// (ErrRedirect), and its calls' errors carry neither the token nor its
// signature (BearerInterceptor).
type Conn struct {
	BaseURL string
	HTTP    *http.Client

	mu     sync.RWMutex
	token  string
	source func() (string, error) // WithTokenSource
	// timeout is the deadline of a unary call whose context has none
	// (WithTimeout); 0: none.
	timeout time.Duration
	// retry is how unary calls are retried (WithRetry); Agent.Run waits
	// by its Wait and Jitter before reconnecting.
	retry RetryPolicy

	Auth       tetherv1connect.AuthServiceClient
	Agent      tetherv1connect.AgentServiceClient
	Capability tetherv1connect.CapabilityServiceClient
	Tool       tetherv1connect.ToolServiceClient
	Supervisor tetherv1connect.SupervisorServiceClient
	Lease      tetherv1connect.LeaseServiceClient
	StopRule   tetherv1connect.StopRuleServiceClient
}

// Option configures Dial.
type Option func(*dialOptions)

type dialOptions struct {
	http    *http.Client
	connect []connect.ClientOption
	source  func() (string, error)
	timeout time.Duration
	retry   *RetryPolicy // nil: DefaultRetry
}

// DefaultTimeout is the deadline of a unary call whose context has none,
// unless WithTimeout says otherwise (the TypeScript and Python SDKs'
// default): a control plane that never answers, or trickles its answer,
// holds no Join, Spawn or ConfirmExit for longer. A context's own
// deadline comes first, shorter or longer; streams (an agent's session, a
// gate's cancel orders, a verifier's revocation feed) carry none.
const DefaultTimeout = 30 * time.Second

// WithTimeout sets the deadline of every unary call whose context has
// none; 0 (or less) gives such calls none, so that they wait until their
// context ends or the connection breaks.
func WithTimeout(d time.Duration) Option {
	return func(o *dialOptions) { o.timeout = max(d, 0) }
}

// WithTokenSource makes the connection present, at each request, the
// token source gives (a file that whoever renews the token rewrites): a
// token that expires can be replaced before it does, and every stream
// opened from then on (a gate's cancel orders, a verifier's revocation
// feed, reopened when the old token's end closes them) presents the new
// one. When source fails or gives "", the last token it gave (at first,
// Dial's) is presented. SetToken has no effect while a source is set.
func WithTokenSource(source func() (string, error)) Option {
	return func(o *dialOptions) { o.source = source }
}

// WithHTTPClient makes the connection use hc: pass HTTP2ClientTLS(baseURL,
// cfg) to trust a private CA or present a client certificate (mutual TLS).
// Without it (or with nil) Dial uses HTTP2Client(baseURL). The Conn uses
// a copy of hc that follows no redirect (ErrRedirect); hc is not changed.
func WithHTTPClient(hc *http.Client) Option {
	return func(o *dialOptions) { o.http = hc }
}

// WithClientOptions adds Connect client options (interceptors, codecs,
// compression) to every service client, after the bearer interceptor and
// the Conn's defaults: connect.WithReadMaxBytes here raises or lowers
// MaxMessageBytes.
func WithClientOptions(opts ...connect.ClientOption) Option {
	return func(o *dialOptions) { o.connect = append(o.connect, opts...) }
}

// MaxMessageBytes is the largest message a Conn reads from the control
// plane, as it comes or once it inflates, unless WithClientOptions says
// otherwise (the TypeScript and Python SDKs' bound too). The control plane
// pages its long answers to stay under 4 MiB; connect's own default is
// 4 GiB, which a peer gone wrong (a proxy's, or a hostile one's answer)
// could fill the process's memory with.
const MaxMessageBytes = 16 << 20

// Dial returns a connection to baseURL ("http://host:port" for HTTP/2
// cleartext, "https://…" for TLS) presenting token ("" presents none) to
// every service. It is the one place the service clients are assembled:
// the CLI and the test server build theirs here too.
func Dial(baseURL, token string, opts ...Option) *Conn {
	o := dialOptions{timeout: DefaultTimeout}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	hc := o.http
	if hc == nil {
		hc = HTTP2Client(baseURL)
	}
	hc = followingNoRedirect(hc)
	c := &Conn{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: hc, token: token, source: o.source, timeout: o.timeout}
	interceptors := []connect.Interceptor{TraceInterceptor(), BearerInterceptor{Token: c.Token}}
	retry := DefaultRetry
	if o.retry != nil {
		retry = *o.retry
	}
	c.retry = retry
	if retry.Attempts > 1 {
		// Outside the bearer interceptor, which presents the token current
		// at each attempt; inside the timeout, which bounds them all.
		interceptors = append([]connect.Interceptor{retrying{retry}}, interceptors...)
	}
	if o.timeout > 0 {
		interceptors = append([]connect.Interceptor{unaryTimeout(o.timeout)}, interceptors...)
	}
	copts := append([]connect.ClientOption{connect.WithInterceptors(interceptors...), connect.WithReadMaxBytes(MaxMessageBytes)}, o.connect...)
	c.Auth = tetherv1connect.NewAuthServiceClient(hc, c.BaseURL, copts...)
	c.Agent = tetherv1connect.NewAgentServiceClient(hc, c.BaseURL, copts...)
	c.Capability = tetherv1connect.NewCapabilityServiceClient(hc, c.BaseURL, copts...)
	c.Tool = tetherv1connect.NewToolServiceClient(hc, c.BaseURL, copts...)
	c.Supervisor = tetherv1connect.NewSupervisorServiceClient(hc, c.BaseURL, copts...)
	c.Lease = tetherv1connect.NewLeaseServiceClient(hc, c.BaseURL, copts...)
	c.StopRule = tetherv1connect.NewStopRuleServiceClient(hc, c.BaseURL, copts...)
	return c
}

// ErrRedirect is why a Conn's request failed when the control plane (or
// whatever answered in its place) answered with a redirect: a Conn follows
// none, since the request would take the bearer token (and a verifier's
// key set would come from) wherever the peer's Location said.
var ErrRedirect = errors.New("agentsdk: the control plane answered with a redirect, which is not followed (the bearer token would go with it): dial the address it redirects to, if that is the control plane")

// followingNoRedirect is a copy of hc that follows no redirect (hc itself,
// which the caller may share, is left as it is).
func followingNoRedirect(hc *http.Client) *http.Client {
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return ErrRedirect }
	return &c
}

// Timeout is the deadline of a unary call whose context has none
// (DefaultTimeout unless WithTimeout said otherwise; 0: none).
func (c *Conn) Timeout() time.Duration { return c.timeout }

// Token returns the current bearer token.
func (c *Conn) Token() string {
	if c.source != nil {
		if t, err := c.source(); err == nil && t != "" {
			c.mu.Lock()
			c.token = t
			c.mu.Unlock()
			return t
		}
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.token
}

// SetToken replaces the bearer token with t, as it is. An Agent takes the
// refreshed credential an answer carries only when it has a credential's
// shape (capability.CompactJWS): one a header cannot carry fails every
// later call in the process, and the agent heard no stop (rogue41I test).
func (c *Conn) SetToken(t string) {
	c.mu.Lock()
	c.token = t
	c.mu.Unlock()
}

// HTTP2Client speaks HTTP/2: cleartext for http:// URLs, TLS for https://
// (verified against the system roots).
func HTTP2Client(baseURL string) *http.Client { return HTTP2ClientTLS(baseURL, nil) }

// HTTP2ClientTLS is HTTP2Client with tlsConfig for https:// URLs: a private
// CA to trust, a client certificate to present (TLSConfig builds one). nil
// means the system roots and no client certificate.
func HTTP2ClientTLS(baseURL string, tlsConfig *tls.Config) *http.Client {
	p := new(http.Protocols)
	if strings.HasPrefix(baseURL, "https://") {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: &http.Transport{Protocols: p, TLSClientConfig: tlsConfig}}
}

// UnaryHTTP1Client is an HTTP client for Dial (WithHTTPClient) that sends
// unary calls over HTTP/1.1 keep-alive connections, at most conns of them
// (0 means 4; a call beyond waits for one to be free), and everything
// else, streams included, over HTTP/2 as HTTP2ClientTLS does. tlsConfig is
// as for HTTP2ClientTLS.
//
// It costs the server less per unary call: Go's HTTP/1.1 server reads,
// handles and answers a request on the connection's own goroutine, where
// its HTTP/2 server hands each request from a frame reader to a serving
// goroutine to a handler goroutine and writes the answer's headers and body
// through two more (docs/capacity.md: about a quarter fewer context
// switches and a fifth less server CPU per lone unary renew). It also
// costs connections: up to conns for unary calls beside the one HTTP/2
// connection, each counted against the server's connection limits; an
// idle one is closed after 30 seconds, before the server's own idle
// timeout would.
func UnaryHTTP1Client(baseURL string, tlsConfig *tls.Config, conns int) *http.Client {
	if conns <= 0 {
		conns = 4
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	unary := &http.Transport{
		Protocols:           p,
		TLSClientConfig:     tlsConfig.Clone(),
		MaxConnsPerHost:     conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
	}
	return &http.Client{Transport: splitTransport{unary: unary, streams: HTTP2ClientTLS(baseURL, tlsConfig).Transport}}
}

// splitTransport sends Connect unary calls one way and everything else
// (Connect streams, gRPC) the other.
type splitTransport struct{ unary, streams http.RoundTripper }

func (t splitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if isConnectUnary(r) {
		return t.unary.RoundTrip(r)
	}
	return t.streams.RoundTrip(r)
}

// CloseIdleConnections closes both transports' idle connections
// (http.Client.CloseIdleConnections).
func (t splitTransport) CloseIdleConnections() {
	for _, rt := range []http.RoundTripper{t.unary, t.streams} {
		if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
}

// isConnectUnary reports a Connect unary call: a POST whose content type
// is application/proto or application/json (a Connect stream's is
// application/connect+…, gRPC's application/grpc…).
func isConnectUnary(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	ct = strings.TrimSpace(ct)
	return ct == "application/proto" || ct == "application/json"
}

// TLSConfig builds the TLS configuration of a client of the control plane:
// caFile (PEM) is the CA that signed the server's certificate ("" trusts
// the system roots); certFile and keyFile (PEM, both or neither) are the
// client certificate presented to a server that requires one
// (tether serve --tls-client-ca).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("agentsdk: TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("agentsdk: TLS CA %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("agentsdk: a client certificate needs both its certificate and its key")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("agentsdk: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// TraceInterceptor is the client side of tracing (otelconnect): a client
// span per call, in the caller's trace, whose W3C trace context rides in the
// request headers, so that the control plane's spans for the call (and the
// store commit and revocation feed behind it) join the caller's trace. It
// uses the global tracer provider: with none installed the spans are the
// API's no-ops and nothing is sent. Dial installs it; clients built by hand
// add it with connect.WithInterceptors.
func TraceInterceptor() connect.Interceptor { return traceInterceptor() }

var traceInterceptor = sync.OnceValue(func() connect.Interceptor {
	i, err := otelconnect.NewInterceptor(otelconnect.WithoutMetrics(),
		otelconnect.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
	if err != nil {
		panic("agentsdk: otelconnect options: " + err.Error()) // static options: unreachable
	}
	return i
})
