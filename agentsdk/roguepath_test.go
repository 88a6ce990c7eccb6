package agentsdk_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The pieces of a rogue path (an http.RoundTripper in front of a real
// server) that more than one test uses.

// relayForgedAck is a rogue path's relay of an ACK: it sends r on through
// next (asking for an answer the path can read) and hands the real answer
// to forge, which rewrites it in place; the client gets the forged answer.
// An answer that is not a plain 200 passes as it came.
func relayForgedAck(next http.RoundTripper, r *http.Request, forge func(*tetherv1.AckResponse)) (*http.Response, error) {
	return relayForged(next, r, &tetherv1.AckResponse{}, forge)
}

// relayForged is relayForgedAck for an answer of any kind: real, empty,
// takes the real answer, forge rewrites it in place.
func relayForged[M proto.Message](next http.RoundTripper, r *http.Request, real M, forge func(M)) (*http.Response, error) {
	r.Header.Del("Accept-Encoding") // an answer the path can read
	resp, err := next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
		return resp, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if err := proto.Unmarshal(answer, real); err != nil {
		return nil, err
	}
	forge(real)
	if answer, err = proto.Marshal(real); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	resp.ContentLength = int64(len(answer))
	resp.Header.Set("Content-Length", strconv.Itoa(len(answer)))
	return resp, nil
}

// peekBody reads the body of the request r a rogue path relays and puts
// it back, for the path to read what the client asked.
func peekBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// peekOwn reports whether r, a request a rogue path relays, is a call of
// method about the job the path forges for, its body read into m (and
// put back for the relay).
func peekOwn(r *http.Request, method, job string, m interface {
	proto.Message
	GetJobId() string
}) (bool, error) {
	if !strings.HasSuffix(r.URL.Path, "/"+method) {
		return false, nil
	}
	body, err := peekBody(r)
	if err != nil {
		return false, err
	}
	return proto.Unmarshal(body, m) == nil && m.GetJobId() == job, nil
}
