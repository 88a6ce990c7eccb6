package agentsdk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// endCallTap keeps the EndCall requests a gate sends to the control plane:
// what it reports is what the ledger keeps, and every viewer of a record
// reads it.
type endCallTap struct {
	base http.RoundTripper
	mu   sync.Mutex
	sent []*tetherv1.EndCallRequest
}

func (e *endCallTap) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/EndCall") && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req tetherv1.EndCallRequest
		if err := proto.Unmarshal(body, &req); err == nil {
			e.mu.Lock()
			e.sent = append(e.sent, &req)
			e.mu.Unlock()
		}
	}
	return e.base.RoundTrip(r)
}

// A rogue agent's input makes the tool fail with an error that quotes the
// request, and with it the caller's capability token (a bearer credential
// for tools): the gate reports the call's end without the token or its
// signature, so the ledger (and every record that lists the call) does not
// hand the token to whoever reads it. Before, the Go gate sent the error as
// it was; the TypeScript and Python gates already cut it out.
func TestToolGateKeepsTheCallersTokenOutOfTheErrorItReports(t *testing.T) {
	ctx := context.Background()
	w := startShellWorld(t)
	tap := &endCallTap{base: w.operator.HTTP.Transport}
	gate := agentsdk.NewToolGate(agentsdk.Dial(w.operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(&http.Client{Transport: tap})), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	token := w.rootToken
	signature := token[strings.LastIndex(token, ".")+1:]
	toolErr := errors.New("cannot parse the request " + token + " (signature " + signature + ") from the agent")
	if err := gate.Call(ctx, token, "shell", func(context.Context) error { return toolErr }); err != toolErr {
		t.Fatalf("Call returned %v, want the tool's own error", shorten(err))
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if len(tap.sent) != 1 {
		t.Fatalf("the gate sent %d EndCall requests, want 1", len(tap.sent))
	}
	got := tap.sent[0].Error
	if !strings.Contains(got, "cannot parse the request") || !tap.sent[0].Failed {
		t.Errorf("the reported end %q (failed %v) lost the tool's error", got, tap.sent[0].Failed)
	}
	if strings.Contains(got, token) || strings.Contains(got, signature[:16]) {
		t.Errorf("the gate reported the caller's capability token to the ledger (%d bytes; the token cut out here: %q)", len(got), strings.ReplaceAll(strings.ReplaceAll(got, token, "<TOKEN>"), signature[:16], "<SIG>"))
	}
}
