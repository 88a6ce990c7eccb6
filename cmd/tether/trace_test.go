package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// collectedSpan is one span as a collector received it.
type collectedSpan struct {
	service, name         string
	traceID, id, parentID string
	links                 []string // span ids
	kind                  tracepb.Span_SpanKind
}

// collector is a small OTLP receiver on loopback: OTLP/HTTP (protobuf) and
// OTLP/gRPC, keeping every span it is sent.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []collectedSpan
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) add(req *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				cs := collectedSpan{service: service, name: s.Name, traceID: hex.EncodeToString(s.TraceId),
					id: hex.EncodeToString(s.SpanId), parentID: hex.EncodeToString(s.ParentSpanId), kind: s.Kind}
				for _, l := range s.Links {
					cs.links = append(cs.links, hex.EncodeToString(l.SpanId))
				}
				c.spans = append(c.spans, cs)
			}
		}
	}
}

// ServeHTTP is OTLP/HTTP's POST /v1/traces.
func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.add(&req)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (c *collector) snapshot() []collectedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]collectedSpan(nil), c.spans...)
}

// startCollector serves OTLP/HTTP and OTLP/gRPC on loopback and returns
// their endpoints.
func startCollector(t *testing.T) (c *collector, httpEndpoint, grpcEndpoint string) {
	t.Helper()
	c = &collector{}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { _ = hs.Close() })
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, c)
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	return c, "http://" + hl.Addr().String(), "http://" + gl.Addr().String()
}

// TestOneTraceSpansTheCLITheServerTheStoreCommitAndTheFeed runs the real
// binaries as an operator would, with only OTEL_* set: `tether serve`
// exporting over OTLP/HTTP and `tether grant revoke` over OTLP/gRPC, to a
// collector on loopback. The revocation is one trace: the CLI command, its
// RPC, the server's span for it, the store commit that made it durable and
// the revocation feed publishing its tombstone, each under the one before.
func TestOneTraceSpansTheCLITheServerTheStoreCommitAndTheFeed(t *testing.T) {
	col, httpEndpoint, grpcEndpoint := startCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", httpEndpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // ms: the server is killed, never flushed
	t.Setenv("OTEL_SERVICE_NAME", "")
	srv := testserver.StartProcess(t, t.TempDir())

	ctx := context.Background()
	admin := srv.Clients(srv.Admin)
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "traced"}))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: root.Msg.Node.NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}

	cli := exec.Command(testserver.Binary(t), "--addr", srv.URL, "--token", srv.Admin, "grant", "revoke", grant.Msg.Grant.GrantId, "--reason", "incident 42")
	cli.Env = append(os.Environ(),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+grpcEndpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_INSECURE=true",
	)
	var out bytes.Buffer
	cli.Stdout, cli.Stderr = &out, &out
	if err := cli.Run(); err != nil {
		t.Fatalf("tether grant revoke: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "warning") {
		t.Fatalf("the CLI warned: %s", out.String())
	}

	// The CLI flushed on exit; the server's batch processor sends within
	// its schedule delay.
	var chain []collectedSpan
	for deadline := time.Now().Add(20 * time.Second); chain == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s no trace goes from the CLI to the revocation feed; the collector has:\n%s", describe(col.snapshot()))
		}
		chain = findChain(col.snapshot(), []step{
			{service: "tether-cli", name: "tether grant revoke"},
			{service: "tether-cli", name: "tether.v1.CapabilityService/Revoke", kind: tracepb.Span_SPAN_KIND_CLIENT},
			{service: "tether", name: "tether.v1.CapabilityService/Revoke", kind: tracepb.Span_SPAN_KIND_SERVER},
			{service: "tether", name: "store.commit"},
			{service: "tether", name: "revocation.publish", parentOf: 2},
		})
	}
	// The commit links the request it made durable.
	if commit := chain[3]; !contains(commit.links, chain[2].id) {
		t.Fatalf("store.commit links %v, want the server span %s", commit.links, chain[2].id)
	}
}

// step is one span of the expected chain. Each is a child of the step
// before, or of step parentOf when set.
type step struct {
	service, name string
	kind          tracepb.Span_SpanKind // 0: any
	parentOf      int
}

// findChain returns the spans of one trace matching steps, or nil.
func findChain(spans []collectedSpan, steps []step) []collectedSpan {
	byTrace := map[string][]collectedSpan{}
	for _, s := range spans {
		byTrace[s.traceID] = append(byTrace[s.traceID], s)
	}
	for _, trace := range byTrace {
		chain := make([]collectedSpan, 0, len(steps))
	steps:
		for i, st := range steps {
			for _, s := range trace {
				if s.service != st.service || s.name != st.name || (st.kind != 0 && s.kind != st.kind) {
					continue
				}
				parent := i - 1
				if st.parentOf != 0 {
					parent = st.parentOf
				}
				if i > 0 && s.parentID != chain[parent].id {
					continue
				}
				chain = append(chain, s)
				continue steps
			}
			break
		}
		if len(chain) == len(steps) {
			return chain
		}
	}
	return nil
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func describe(spans []collectedSpan) string {
	lines := make([]string, 0, len(spans))
	for _, s := range spans {
		lines = append(lines, fmt.Sprintf("%s %s/%s parent=%s %s %q", s.traceID[:8], s.service, s.id, s.parentID, s.kind, s.name))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
