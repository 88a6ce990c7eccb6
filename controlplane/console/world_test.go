package console_test

import (
	"context"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// world is a real control plane (manual clock) with a three-level tree:
//
//	planner
//	├── worker-1          (holds job-1)
//	│   ├── helper
//	│   └── rogue         (a tool call in flight, a lock whose revocation
//	│                      webhook fails; never confirms its exit)
//	└── worker-2
//
// and grants delegated down it by the agents themselves.
type world struct {
	srv      *testserver.Server
	clk      *clock.Manual
	admin    *testserver.Clients
	nodes    map[string]*tetherv1.Node
	creds    map[string]string
	grants   map[string]string // holder name → grant id
	tokens   map[string]string // holder name → capability token
	lockHook *httptest.Server  // the lock service: refuses every revocation
}

func newWorld(t *testing.T) *world {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	w := &world{srv: srv, clk: clk, admin: srv.AdminClients(), nodes: map[string]*tetherv1.Node{}, creds: map[string]string{}, grants: map[string]string{}, tokens: map[string]string{}}
	ctx := context.Background()
	root, err := w.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner", Labels: map[string]string{"team": "research"}}))
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["planner"], w.creds["planner"] = root.Msg.Node, root.Msg.Credential
	for _, s := range []struct{ parent, name, role string }{
		{"planner", "worker-1", "worker"}, {"planner", "worker-2", "worker"},
		{"worker-1", "helper", "retrieval"}, {"worker-1", "rogue", "code-exec"},
	} {
		resp, err := w.srv.Clients(w.creds[s.parent]).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{
			ParentNodeId: w.nodes[s.parent].NodeId, Name: s.name, Labels: map[string]string{"team": "research", "role": s.role},
		}))
		if err != nil {
			t.Fatalf("spawn %s: %v", s.name, err)
		}
		w.nodes[s.name], w.creds[s.name] = resp.Msg.Node, resp.Msg.Credential
	}
	issued, err := w.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{
		HolderNodeId: w.nodes["planner"].NodeId, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		t.Fatal(err)
	}
	w.grants["planner"] = issued.Msg.Grant.GrantId
	for _, d := range []struct{ from, to, scope string }{
		{"planner", "worker-1", "tool:http"}, {"planner", "worker-2", "tool:http"},
		{"worker-1", "helper", "tool:http"}, {"worker-1", "rogue", "tool:http"},
	} {
		resp, err := w.srv.Clients(w.creds[d.from]).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{
			ParentGrantId: w.grants[d.from], HolderNodeId: w.nodes[d.to].NodeId, Scopes: []string{d.scope}, Ttl: durationpb.New(30 * time.Minute),
		}))
		if err != nil {
			t.Fatalf("delegate to %s: %v", d.to, err)
		}
		w.grants[d.to], w.tokens[d.to] = resp.Msg.Grant.GrantId, resp.Msg.Token
	}
	// The rogue holds a lock (revoked by a webhook that answers 503) and
	// has a call in flight, begun by a tool server's gate.
	w.lockHook = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, "lock service unavailable", http.StatusServiceUnavailable)
	}))
	t.Cleanup(w.lockHook.Close)
	if _, err := w.admin.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
		NodeId: w.nodes["rogue"].NodeId, GrantId: w.grants["rogue"], Kind: "file_lock", ExternalId: "/data/train.lock",
		ExpiresAt: timestamppb.New(clk.Now().Add(24 * time.Hour)), RevokeUrl: w.lockHook.URL + "/unlock?key=s3cr3t-webhook-key",
	})); err != nil {
		t.Fatal(err)
	}
	gate := w.srv.Clients(w.srv.ToolServerToken(t, "gate-http"))
	if _, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: w.tokens["rogue"], Tool: "http", GateId: "gate-http"})); err != nil {
		t.Fatal(err)
	}
	// job-1: offered to worker-1, acknowledged, then a stale acknowledgement
	// of a generation that does not exist (a rejected row in the matrix).
	offer, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: w.nodes["worker-1"].NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	worker := w.srv.Clients(w.creds["worker-1"]).Lease
	l := offer.Msg.Lease
	if _, err := worker.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration + 5})); err != nil {
		t.Fatal(err)
	}
	// A progress value is the agent's own text: here, a spreadsheet formula.
	if _, err := worker.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: "job-1", LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: `=HYPERLINK("http://evil.example","40%")`})); err != nil {
		t.Fatal(err)
	}
	return w
}

// token mints an operator token with a role.
func (w *world) token(t *testing.T, role tetherv1.Role) string {
	t.Helper()
	resp, err := w.admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Ttl: durationpb.New(time.Hour), Subject: strings.ToLower(strings.TrimPrefix(role.String(), "ROLE_"))}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Token
}

func (w *world) node(t *testing.T, name string) *tetherv1.Node {
	t.Helper()
	resp, err := w.admin.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.nodes[name].NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node
}

func (w *world) waitTermination(t *testing.T, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	return testserver.WaitTermination(t, w.admin, id, state)
}

// browser is a plain HTTP client with a cookie jar, speaking to the
// console as a browser would (no JavaScript).
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
	// bind is the secret the first page of its last sign-in carried,
	// which the console's script adds to every form posted (post does,
	// unless the form names one).
	bind string
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, _ := http.NewRequest("GET", b.base+path, nil)
	return b.do(req)
}

// post sends a form; headers such as Origin and Sec-Fetch-Site are set
// as a browser would (pass nil for a non-browser client that sends none).
func (b *browser) post(path string, form url.Values, headers map[string]string) page {
	b.t.Helper()
	if _, ok := form["bind"]; !ok && b.bind != "" {
		form = maps.Clone(form)
		form.Set("bind", b.bind)
	}
	req, _ := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return b.do(req)
}

// sameOrigin is what a browser sends with a form posted from a console page.
func (b *browser) sameOrigin() map[string]string {
	return map[string]string{"Origin": b.base, "Sec-Fetch-Site": "same-origin"}
}

func (b *browser) signIn(token string) page {
	b.t.Helper()
	p := b.post("/ui/signin", url.Values{"token": {token}}, b.sameOrigin())
	if p.status == http.StatusSeeOther && p.header.Get("Location") == "/ui/tree" {
		// As a browser follows the redirect, and its script keeps the
		// secret the page carries.
		if m := bindMeta.FindStringSubmatch(b.get("/ui/tree").body); m != nil {
			b.bind = m[1]
		}
	}
	return p
}

var bindMeta = regexp.MustCompile(`<meta name="tether-bind" content="([^"]+)">`)

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the session's CSRF token from a page.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	m := csrfField.FindStringSubmatch(b.get(path).body)
	if m == nil {
		b.t.Fatalf("no CSRF token on %s", path)
	}
	return m[1]
}
