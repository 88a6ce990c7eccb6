package agentsdk_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
)

// countingTransport counts the requests whose path ends in method.
type countingTransport struct {
	next   http.RoundTripper
	method string
	n      atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/"+c.method) {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// A rogue caller of a fenced tool names a job id the coordinator never
// issues (longer than its 256-byte bound, not UTF-8, holding a control
// character): the fence asked the coordinator, whose refusal
// (invalid_argument, or the client's own marshalling error) it took for an
// outage and answered 503, blaming the control plane for the caller's
// request. A request naming its generation twice (the fence read the
// first; the TypeScript fence refuses it, the Python one read the last),
// or as "01", passed. Each is answered 400 now, nothing is asked or
// remembered, and the job's holder still writes.
func TestRogue21AFenceRefusesAJobIDTheCoordinatorNeverIssuesWithoutAsking(t *testing.T) {
	s := newLeaseSetup(t)
	asked := &countingTransport{next: s.srv.HTTP.Transport, method: "GetLease"}
	tool := agentsdk.Dial(s.srv.URL, s.srv.ToolServerToken(t, "rogue21-fenced-tool"), agentsdk.WithHTTPClient(&http.Client{Transport: asked}))
	fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(tool)}
	var effects atomic.Int64
	tsrv := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { effects.Add(1) })))
	defer tsrv.Close()
	send := func(h http.Header) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, tsrv.URL+"/write", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := tsrv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	w := s.newWorker(t, t.TempDir(), time.Hour)
	job, d, err := w.Accept(context.Background(), s.offer(t, "rogue21-fenced", time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", d, err)
	holder := http.Header{}
	job.Header(holder)

	long := strings.Repeat("j", agentsdk.MaxJobIDBytes+1)
	for name, h := range map[string]http.Header{
		"a job id of 257 bytes":  fencing(long, 1),
		"a job id not UTF-8":     fencing("rogue21-\xff\xfe", 1),
		"the generation twice":   {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"1", "7"}},
		"the job id twice":       {agentsdk.HeaderJobID: {"rogue21-fenced", "other"}, agentsdk.HeaderLeaseGeneration: {"1"}},
		"a generation with a 0":  {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"01"}},
		"a generation with a +":  {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"+1"}},
		"a generation past 2^64": {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"18446744073709551616"}},
		"a generation of 0":      {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"0"}},
		"a negative generation":  {agentsdk.HeaderJobID: {"rogue21-fenced"}, agentsdk.HeaderLeaseGeneration: {"-1"}},
		"no generation":          {agentsdk.HeaderJobID: {"rogue21-fenced"}},
		"an empty job id":        {agentsdk.HeaderJobID: {""}, agentsdk.HeaderLeaseGeneration: {"1"}},
	} {
		if code, body := send(h); code != http.StatusBadRequest {
			t.Errorf("%s: answered %d %q, want 400", name, code, body)
		} else if strings.Contains(body, long) {
			t.Errorf("%s: the answer quotes the caller's job id", name)
		}
	}
	// Through the API: the same refusal, as a job the coordinator never
	// issued (a tool server mapping errors as the Middleware does answers
	// 403, not 503), for a control character too (no HTTP client sends one).
	for _, id := range []string{long, "rogue21-\xff", "rogue21-\x01", "rogue21-\u0085"} {
		if err := fence.AdmitContext(context.Background(), id, 1); !errors.Is(err, agentsdk.ErrUnissuedGeneration) {
			t.Errorf("AdmitContext(%q): %v, want ErrUnissuedGeneration", id[:min(len(id), 12)], err)
		}
		if fence.Highest(id) != 0 {
			t.Errorf("the fence remembers a job id it refused")
		}
	}
	if n := effects.Load(); n != 0 {
		t.Fatalf("%d side effects got through", n)
	}
	if n := asked.n.Load(); n != 0 {
		t.Fatalf("the fence asked the coordinator %d times about requests it could refuse on their face", n)
	}
	if code, body := send(holder); code != http.StatusOK || effects.Load() != 1 {
		t.Fatalf("the job's holder: %d %q", code, body)
	}
}
