package console

import (
	"io"
	"net/http"
	"sync"
)

// handlerTransport is an http.RoundTripper that serves each request with an
// http.Handler in process, streaming the response body through a pipe (so
// server-streaming RPCs such as WatchTermination work). The console's
// Connect clients use it with the server's own handler: the request goes
// through the same mux, interceptors and policy as a request from the
// network, without a socket.
type handlerTransport struct {
	handler http.Handler
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.Host = req.URL.Host
	in.RemoteAddr = "console"
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
