package console

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// peerKey carries, in a console request's context, the address of the
// browser it serves (see withPeer).
type peerKey struct{}

// withPeer returns r with its source address in its context, so that the
// API calls made for it come from that address: the API bounds per source
// address the requests that carry no valid credential, and a sign-in
// posted from anywhere must be charged to the address that posted it, not
// to one address every operator shares.
func withPeer(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), peerKey{}, r.RemoteAddr))
}

// peerOf is the source address withPeer put in ctx, or "console" for a
// call made outside any browser's request.
func peerOf(ctx context.Context) string {
	if addr, ok := ctx.Value(peerKey{}).(string); ok && addr != "" {
		return addr
	}
	return "console"
}

// handlerTransport is an http.RoundTripper that serves each request with an
// http.Handler in process, streaming the response body through a pipe (so
// server-streaming RPCs such as WatchTermination work). The console's
// Connect clients use it with the server's own handler: the request goes
// through the same mux, interceptors and policy as a request from the
// network, without a socket, and from the address of the browser whose page
// it serves (withPeer).
type handlerTransport struct {
	handler http.Handler
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.Host = req.URL.Host
	in.RemoteAddr = peerOf(req.Context())
	in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/1.1", 1, 1
	if in.Body == nil {
		in.Body = http.NoBody
	}
	go func() {
		defer w.finish()
		t.handler.ServeHTTP(w, in)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:        http.StatusText(w.status),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          pr,
		ContentLength: -1,
		Request:       req,
	}, nil
}

// pipeResponse is the handler's side of handlerTransport.
type pipeResponse struct {
	header http.Header
	sent   http.Header
	status int
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	w.once.Do(func() {
		w.status = code
		w.sent = w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush sends the headers; the body is unbuffered already.
func (w *pipeResponse) Flush() { w.WriteHeader(http.StatusOK) }

func (w *pipeResponse) finish() {
	w.WriteHeader(http.StatusOK)
	_ = w.body.Close()
}
