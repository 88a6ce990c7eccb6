package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth hostile pass on the clients that page through the
// control plane's answers (letter C), the CLI's part: a rogue path to the
// control plane (a proxy, or a replica under a rogue's control) in front of
// a real server forges the pages of a listing the CLI reads to its end.

// TestRogue44CLeaseEvidenceEndsOnAPathThatCyclesItsPages: `tether lease
// evidence` reads a job's evidence to its last page (the matrix is not cut
// at --limit). The path answers the first page with a next token "A", the
// page "A" with "B" and "B" with "A" again, each carrying the first page's
// rows: the CLI refused only a token equal to the one it asked with, and
// printed the same rows again and again (200 pages when the test stopped
// it). It stops now at the first token answered twice, with an error.
func TestRogue44CLeaseEvidenceEndsOnAPathThatCyclesItsPages(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-44c", HolderIdentity: root.Msg.Node.NodeId})); err != nil {
		t.Fatal(err)
	}

	api := srv.Handler()
	var calls atomic.Int32
	var first *tetherv1.EvidenceResponse
	addr := serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/Evidence") {
			api.ServeHTTP(w, r)
			return
		}
		if calls.Add(1) > 200 {
			stop() // the test's end of a listing that would not end
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		var req tetherv1.EvidenceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Error(err)
			return
		}
		if first == nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, r)
			plain := rec.Body.Bytes()
			if rec.Header().Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(plain))
				if err != nil {
					t.Error(err)
					return
				}
				if plain, err = io.ReadAll(zr); err != nil {
					t.Error(err)
					return
				}
			}
			first = &tetherv1.EvidenceResponse{}
			if err := proto.Unmarshal(plain, first); err != nil || len(first.Rows) == 0 {
				t.Errorf("the real first page: %v, %d rows", err, len(first.Rows))
				return
			}
		}
		answer := proto.Clone(first).(*tetherv1.EvidenceResponse)
		answer.NextPageToken = map[string]string{"": "A", "A": "B", "B": "A"}[req.PageToken]
		b, err := proto.Marshal(answer)
		if err != nil {
			t.Error(err)
			return
		}
		w.Header().Set("Content-Type", "application/proto")
		_, _ = w.Write(b)
	}))

	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--addr", addr, "--token", srv.Admin, "lease", "evidence", "job-44c", "-o", "csv"})
	err = cmd.ExecuteContext(ctx)
	n := calls.Load()
	if err == nil || ctx.Err() != nil || n > 3 || !strings.Contains(err.Error(), "already read") {
		t.Fatalf("lease evidence read %d pages (%d bytes printed) and returned %v; want an error at the 3rd page, the 2nd page's token answered again", n, out.Len(), err)
	}
}
