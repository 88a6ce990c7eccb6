package agentsdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth hostile pass on the SDK clients that page through the
// control plane's answers (letter C): a rogue path to the control plane (a
// proxy, or a replica under a rogue's control) in front of a real embedded
// server forges the pages an honest operator or parent reads: ListSubtree
// of a rogue's subtree, ReadRecord / ReadRecordPages of the record of its
// stop. Before, a page without a record had ReadRecordPages dereference
// nil (a panic: in the console, the control plane's own process), and a
// path that answered a page token already read as the next one (two pages
// pointing at each other) kept either reader asking for ever.

// rogue44CPath relays every call to the real server but the procedure it
// forges (its path suffix): forge gets the request (its body decoded by
// the test) and, when relay is set, the real answer's bytes (nil when the
// server refused the call), and returns the bytes to answer. It counts the forged procedure's calls, and cancels
// stop once they pass limit: the test's own end of a read that would not
// end.
type rogue44CPath struct {
	next   http.RoundTripper
	suffix string
	relay  bool
	forge  func(n int, req []byte, real []byte) []byte
	limit  int
	stop   context.CancelFunc

	mu    sync.Mutex
	calls atomic.Int32
}

func (p *rogue44CPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, p.suffix) {
		return p.next.RoundTrip(r)
	}
	n := int(p.calls.Add(1))
	if n > p.limit {
		p.stop()
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	var real []byte
	if p.relay {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.Header.Del("Accept-Encoding") // answers the path can read
		resp, err := p.next.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		real, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
			real = nil // a forged token's refusal: the path answers its own
		}
	}
	p.mu.Lock()
	answer := p.forge(n, body, real)
	p.mu.Unlock()
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header:        http.Header{"Content-Type": {"application/proto"}, "Content-Length": {strconv.Itoa(len(answer))}},
		Body:          io.NopCloser(bytes.NewReader(answer)),
		ContentLength: int64(len(answer)),
		Request:       r,
	}, nil
}

// through dials the embedded server with token through path, whose limit
// cancels the context it returns.
func rogue44CDial(t *testing.T, url, token string, path *rogue44CPath) (*agentsdk.Conn, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	path.next, path.stop = agentsdk.HTTP2Client(url).Transport, cancel
	return agentsdk.Dial(url, token, agentsdk.WithHTTPClient(&http.Client{Transport: path})), ctx
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Error(err)
	}
	return b
}

// noPanic runs f, a panic reported as an error.
func noPanic(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return f()
}

// rogue44CSubtree is a parent whose rogue child spawned 20 children: a
// subtree of 22 nodes, three pages of 8.
func rogue44CSubtree(t *testing.T) (url, admin, root string) {
	t.Helper()
	ctx := context.Background()
	srv, _, parent := embeddedRoot(t, "rogue44c-parent")
	child := spawnChild(t, parent, "rogue44c-rogue")
	rogue, err := agentsdk.Join(ctx, srv.URL, child.Credential, agentsdk.HTTP2Client(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	specs := make([]agentsdk.ChildSpec, 20)
	for i := range specs {
		specs[i] = agentsdk.ChildSpec{Name: fmt.Sprintf("grandchild-%02d", i)}
	}
	if _, err := rogue.SpawnBatch(ctx, specs); err != nil {
		t.Fatal(err)
	}
	return srv.URL, srv.AdminToken, parent.NodeID()
}

// TestRogue44CListSubtreeEndsOnAPathThatCyclesItsPages: the path answers
// the third page's request with the second page's token as the next (the
// pages it relays are the server's own): the operator's ListSubtree asked
// the second and third pages again and again (200 calls when the test
// stopped it, ending with the test's cancel). It ends now with an error
// at the first token answered twice.
func TestRogue44CListSubtreeEndsOnAPathThatCyclesItsPages(t *testing.T) {
	url, admin, root := rogue44CSubtree(t)
	var tokens []string
	path := &rogue44CPath{suffix: "/ListNodes", relay: true, limit: 200, forge: func(n int, req, real []byte) []byte {
		var resp tetherv1.ListNodesResponse
		if err := proto.Unmarshal(real, &resp); err != nil {
			t.Error(err)
		}
		if len(tokens) < 2 {
			tokens = append(tokens, resp.NextPageToken)
		} else {
			var asked tetherv1.ListNodesRequest
			if err := proto.Unmarshal(req, &asked); err != nil {
				t.Error(err)
			}
			if asked.PageToken == tokens[1] {
				resp.NextPageToken = tokens[0] // back to the second page
			}
		}
		return mustMarshal(t, &resp)
	}}
	conn, ctx := rogue44CDial(t, url, admin, path)
	nodes, err := agentsdk.ListSubtree(ctx, conn.Agent, &tetherv1.ListNodesRequest{RootNodeId: root, PageSize: 8})
	calls := path.calls.Load()
	if err == nil || ctx.Err() != nil || calls > 4 {
		t.Fatalf("ListSubtree asked %d pages, answered %d nodes and %v; want an error at the 4th page, the token of the 2nd answered again", calls, len(nodes), err)
	}
	if !strings.Contains(err.Error(), "already read") {
		t.Fatalf("ListSubtree: %v; want the page named twice said", err)
	}
}

// TestRogue44CListSubtreeIsBoundedOnAPathThatAnswersFreshTokens: the path
// answers every page after the first with a page of no nodes and a token
// never answered before. ListSubtree read on for ever (the test stopped it
// at MaxPages+100 calls); it stops now after MaxPages answers with an
// error saying so. A page of more nodes than page_size is refused too.
func TestRogue44CListSubtreeIsBoundedOnAPathThatAnswersFreshTokens(t *testing.T) {
	url, admin, root := rogue44CSubtree(t)
	path := &rogue44CPath{suffix: "/ListNodes", limit: agentsdk.MaxPages + 100, forge: func(n int, req, real []byte) []byte {
		return mustMarshal(t, &tetherv1.ListNodesResponse{NextPageToken: fmt.Sprintf("node-forged-%d", n)})
	}}
	conn, ctx := rogue44CDial(t, url, admin, path)
	_, err := agentsdk.ListSubtree(ctx, conn.Agent, &tetherv1.ListNodesRequest{RootNodeId: root, PageSize: 8})
	calls := path.calls.Load()
	if err == nil || ctx.Err() != nil || calls > agentsdk.MaxPages {
		t.Fatalf("ListSubtree asked %d pages and returned %v; want an error after at most MaxPages (%d)", calls, err, agentsdk.MaxPages)
	}

	// A page of 9 nodes asked in pages of 8: the same node again and again.
	big := &rogue44CPath{suffix: "/ListNodes", relay: true, limit: 10, forge: func(n int, req, real []byte) []byte {
		var resp tetherv1.ListNodesResponse
		if err := proto.Unmarshal(real, &resp); err != nil {
			t.Error(err)
		}
		for len(resp.Nodes) < 9 {
			resp.Nodes = append(resp.Nodes, resp.Nodes[0])
		}
		resp.NextPageToken = ""
		return mustMarshal(t, &resp)
	}}
	conn, ctx = rogue44CDial(t, url, admin, big)
	if nodes, err := agentsdk.ListSubtree(ctx, conn.Agent, &tetherv1.ListNodesRequest{RootNodeId: root, PageSize: 8}); err == nil {
		t.Fatalf("ListSubtree in pages of 8 took a page of %d nodes", len(nodes))
	}
}

// rogue44CRecord stops a root with 30 children (abort, nobody connected)
// and returns the record's id: 31 nodes, pages of 4 entries.
func rogue44CRecord(t *testing.T) (url, admin, recordID string) {
	t.Helper()
	ctx := context.Background()
	srv, operator, root := embeddedRoot(t, "rogue44c-stopped")
	specs := make([]agentsdk.ChildSpec, 30)
	for i := range specs {
		specs[i] = agentsdk.ChildSpec{Name: fmt.Sprintf("child-%02d", i)}
	}
	if _, err := root.SpawnBatch(ctx, specs); err != nil {
		t.Fatal(err)
	}
	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: root.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "rogue44c",
		DrainWindow: durationpb.New(0), CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0),
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the stop's record", func() bool {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.Msg.Termination.TerminationId}))
		if err != nil {
			t.Fatal(err)
		}
		recordID = got.Msg.Termination.RecordId
		return recordID != ""
	})
	return srv.URL, srv.AdminToken, recordID
}

// TestRogue44CRecordReaderRefusesAForgedPage: the path answers a GetRecord
// page without its record (the first answer, or a following one), or a
// following page without an entry and a token never answered before.
// ReadRecordPages dereferenced nil on the first two (a panic: the console
// draws a record page with it, in the control plane's own process) and
// read the third for ever (stopped by the test at 200 calls). Each is a
// clear error now.
func TestRogue44CRecordReaderRefusesAForgedPage(t *testing.T) {
	url, admin, recordID := rogue44CRecord(t)
	for _, c := range []struct {
		name  string
		forge func(n int, req, real []byte) []byte
	}{
		{"a first answer without its record", func(n int, req, real []byte) []byte {
			return mustMarshal(t, &tetherv1.GetRecordResponse{NextPageToken: "more"})
		}},
		{"a following page without its record", func(n int, req, real []byte) []byte {
			if n == 1 {
				return real
			}
			return mustMarshal(t, &tetherv1.GetRecordResponse{NextPageToken: fmt.Sprintf("forged-%d", n)})
		}},
		{"following pages without an entry", func(n int, req, real []byte) []byte {
			if n == 1 {
				return real
			}
			return mustMarshal(t, &tetherv1.GetRecordResponse{Record: &tetherv1.ReconciliationRecord{}, NextPageToken: fmt.Sprintf("forged-%d", n)})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := &rogue44CPath{suffix: "/GetRecord", relay: true, limit: 200, forge: c.forge}
			conn, ctx := rogue44CDial(t, url, admin, path)
			for _, answers := range []int{0, 4} {
				path.calls.Store(0)
				err := noPanic(func() error {
					_, _, err := agentsdk.ReadRecordPages(ctx, conn.Supervisor, &tetherv1.GetRecordRequest{RecordId: recordID, PageSize: 4}, answers)
					return err
				})
				if err == nil || ctx.Err() != nil || strings.Contains(err.Error(), "panicked") || path.calls.Load() > 2 {
					t.Fatalf("ReadRecordPages(%d answers) asked %d pages and returned %v; want an error at the forged page", answers, path.calls.Load(), err)
				}
			}
		})
	}
}

// TestRogue44CRecordReaderEndsOnAPathThatCyclesItsPages: the path answers
// the third page's request with the second page's token as the next (the
// pages it relays are the server's own). ReadRecord (`tether record show`,
// the console's record JSON) asked the second and third pages again and
// again, the record growing by their entries each time (200 calls when
// the test stopped it); it ends now with an error at the first token
// answered twice.
func TestRogue44CRecordReaderEndsOnAPathThatCyclesItsPages(t *testing.T) {
	url, admin, recordID := rogue44CRecord(t)
	var tokens []string
	path := &rogue44CPath{suffix: "/GetRecord", relay: true, limit: 200, forge: func(n int, req, real []byte) []byte {
		var resp tetherv1.GetRecordResponse
		if err := proto.Unmarshal(real, &resp); err != nil {
			t.Error(err)
		}
		if len(tokens) < 2 {
			tokens = append(tokens, resp.NextPageToken)
		} else {
			var asked tetherv1.GetRecordRequest
			if err := proto.Unmarshal(req, &asked); err != nil {
				t.Error(err)
			}
			if asked.PageToken == tokens[1] {
				resp.NextPageToken = tokens[0]
			}
		}
		return mustMarshal(t, &resp)
	}}
	conn, ctx := rogue44CDial(t, url, admin, path)
	rec, err := agentsdk.ReadRecord(ctx, conn.Supervisor, &tetherv1.GetRecordRequest{RecordId: recordID, PageSize: 4})
	calls := path.calls.Load()
	if err == nil || ctx.Err() != nil || calls > 4 {
		t.Fatalf("ReadRecord asked %d pages and returned %d nodes, %v; want an error at the 4th page, the token of the 2nd answered again", calls, len(rec.GetNodes()), err)
	}
	if errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "already read") {
		t.Fatalf("ReadRecord: %v; want the page named twice said", err)
	}
}

// TestRogue44CLauncherEndsOnAPathThatCyclesItsPages: a Launcher with an
// Instance lists its predecessors' roots (ListNodes, one level, a page at
// a time) before it starts its agent. A path that answers the second
// page's request with the first page's token as the next kept Run listing
// for ever (200 calls when the test stopped it), the agent never started
// and nothing said why: it did not even look at whether the next token
// was the one it asked with. Run now fails at the first token answered
// twice, saying so.
func TestRogue44CLauncherEndsOnAPathThatCyclesItsPages(t *testing.T) {
	srv := startEmbedded(t)
	path := &rogue44CPath{suffix: "/ListNodes", limit: 200, forge: func(n int, req, real []byte) []byte {
		return mustMarshal(t, &tetherv1.ListNodesResponse{NextPageToken: []string{"node-forged-a", "node-forged-b"}[(n+1)%2]})
	}}
	conn, ctx := rogue44CDial(t, srv.URL, srv.AdminToken, path)
	l, err := agentsdk.NewLauncher(agentsdk.LauncherConfig{
		Operator: conn, Name: "rogue44c", Instance: "host-44c",
		Versions: []agentsdk.Version{{Name: "v1", Command: "sleep", Args: []string{"600"}}}, Start: "v1",
		Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Run(ctx)
	calls := path.calls.Load()
	if err == nil || ctx.Err() != nil || calls > 3 || !strings.Contains(err.Error(), "already read") {
		t.Fatalf("Run listed %d pages and returned %v; want an error at the 3rd page, the 1st page's token answered again", calls, err)
	}
	if node, _ := l.Current(); node != "" {
		t.Fatalf("the launcher started node %s", node)
	}
}

// TestRogue44CAncestorPathsTakesNoForgedNodeForAnAncestor: AncestorPaths
// (the CLI's `agent ls`, the console's filtered view) names a listed
// node's ancestors with a GetNode each. A path that answers GetNode with
// no node had it dereference nil (a panic); one that answers with another
// node had the ancestor named as that node. An answer that is not the node
// asked for now leaves the ancestor's id.
func TestRogue44CAncestorPathsTakesNoForgedNodeForAnAncestor(t *testing.T) {
	url, admin, root := rogue44CSubtree(t)
	honest := agentsdk.Dial(url, admin)
	nodes, err := agentsdk.ListSubtree(context.Background(), honest.Agent, &tetherv1.ListNodesRequest{RootNodeId: root, PageSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	leaf := nodes[len(nodes)-1] // a grandchild: the root and the rogue above it
	if len(leaf.Ancestors) != 2 {
		t.Fatalf("the leaf has %d ancestors, want 2", len(leaf.Ancestors))
	}
	for _, c := range []struct {
		name  string
		forge *tetherv1.GetNodeResponse
	}{
		{"no node", &tetherv1.GetNodeResponse{}},
		{"another node", &tetherv1.GetNodeResponse{Node: &tetherv1.Node{NodeId: "n_forged", Name: "trusted-worker"}}},
	} {
		path := &rogue44CPath{suffix: "/GetNode", limit: 10, forge: func(n int, req, real []byte) []byte { return mustMarshal(t, c.forge) }}
		conn, ctx := rogue44CDial(t, url, admin, path)
		var paths map[string]string
		if err := noPanic(func() error {
			paths = agentsdk.AncestorPaths(ctx, conn.Agent, []*tetherv1.Node{leaf}, 10)
			return nil
		}); err != nil {
			t.Fatalf("%s: AncestorPaths %v", c.name, err)
		}
		if want := strings.Join(leaf.Ancestors, "/"); paths[leaf.NodeId] != want {
			t.Fatalf("%s: the leaf's ancestors read %q, want their ids %q", c.name, paths[leaf.NodeId], want)
		}
	}
}
