package controlplane_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// A procedure the server does not have: without a credential the caller
// learns nothing (unauthenticated, the body never read); with one it is
// told there is no such procedure (unimplemented), not that it may not
// call it.
func TestUnknownProceduresAreUnimplementedForTheAuthenticated(t *testing.T) {
	srv := testserver.Start(t)
	for _, tc := range []struct {
		token string
		want  int
		code  string
	}{
		{"", http.StatusUnauthorized, "unauthenticated"},
		{srv.Admin, http.StatusNotImplemented, "unimplemented"},
	} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/tether.v1.AgentService/NoSuchMethod", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body strings.Builder
		_, _ = io.Copy(&body, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.Contains(body.String(), `"code":"`+tc.code+`"`) {
			t.Errorf("token %v: HTTP %d %s, want %d with code %s", tc.token != "", resp.StatusCode, body.String(), tc.want, tc.code)
		}
	}
}

func TestPolicyCoversEveryProcedure(t *testing.T) {
	policy := controlplane.Policy()
	count := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				procedure := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				count++
				if _, ok := policy[procedure]; !ok {
					t.Errorf("%s has no authorisation rule", procedure)
				}
			}
		}
		return true
	})
	if count < 40 {
		t.Fatalf("found only %d procedures; is the proto package registered?", count)
	}
	if len(policy) != count {
		t.Errorf("policy has %d rules for %d procedures: a rule names a procedure that does not exist", len(policy), count)
	}
}

func register(t *testing.T, c *testserver.Clients, name string) *tetherv1.RegisterRootResponse {
	t.Helper()
	resp, err := c.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: name, Labels: map[string]string{"team": "research"}}))
	if err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return resp.Msg
}

func spawn(t *testing.T, c *testserver.Clients, parent, name string) *tetherv1.SpawnResponse {
	t.Helper()
	resp, err := c.Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: name}))
	if err != nil {
		t.Fatalf("spawn %s under %s: %v", name, parent, err)
	}
	return resp.Msg
}

func TestRegisterAndSpawnBuildTheTree(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	// The planner spawns with its own credential; its worker spawns below it.
	planner := srv.Clients(root.Credential)
	worker := spawn(t, planner, root.Node.NodeId, "worker-1")
	spawn(t, planner, root.Node.NodeId, "worker-2")
	grandchild := spawn(t, srv.Clients(worker.Credential), worker.Node.NodeId, "retrieval")

	if got, want := grandchild.Node.Ancestors, []string{root.Node.NodeId, worker.Node.NodeId}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ancestors = %v, want %v", got, want)
	}
	if grandchild.Node.CreatedBy != "agent:"+worker.Node.NodeId {
		t.Fatalf("created_by = %q", grandchild.Node.CreatedBy)
	}
	list, err := admin.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: root.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Nodes) != 4 || list.Msg.Nodes[0].NodeId != root.Node.NodeId {
		t.Fatalf("subtree has %d nodes (first %s), want 4 starting at the root", len(list.Msg.Nodes), list.Msg.Nodes[0].NodeId)
	}
	// The worker sees only its own subtree.
	sub, err := srv.Clients(worker.Credential).Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(sub.Msg.Nodes) != 2 {
		t.Fatalf("worker's own subtree has %d nodes, want 2", len(sub.Msg.Nodes))
	}
	if _, err := srv.Clients(worker.Credential).Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("worker reading its parent: %v, want not_found (as a node that does not exist)", err)
	}
	// Label selector over the whole tree.
	sel, err := admin.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: "team=research"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(sel.Msg.Nodes) != 1 {
		t.Fatalf("selector matched %d nodes, want 1", len(sel.Msg.Nodes))
	}
}

func TestAgentCannotSpawnUnderAnotherAgentsNode(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	a := register(t, admin, "a")
	b := register(t, admin, "b")
	_, err := srv.Clients(a.Credential).Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: b.Node.NodeId, Name: "intruder"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("spawn under another agent: %v, want permission_denied", err)
	}
	if !strings.Contains(err.Error(), "only under its own node") {
		t.Fatalf("reason %q does not say why", err)
	}
	assertNodeCount(t, admin, 2)
}

func TestRolesAreEnforced(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	mint := func(role tetherv1.Role) string {
		resp, err := admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Token
	}
	viewer := srv.Clients(mint(tetherv1.Role_ROLE_VIEWER))
	operator := srv.Clients(mint(tetherv1.Role_ROLE_OPERATOR))
	if _, err := viewer.Agent.RegisterRoot(context.Background(), connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "x"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("viewer register: %v, want permission_denied", err)
	}
	register(t, operator, "ok")
	if _, err := viewer.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{})); err != nil {
		t.Fatalf("viewer list: %v", err)
	}
	if _, err := operator.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_ADMIN})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("operator minting an admin token: %v, want permission_denied", err)
	}
	who, err := viewer.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil || who.Msg.Role != tetherv1.Role_ROLE_VIEWER {
		t.Fatalf("whoami = %v, %v", who, err)
	}
}

func assertNodeCount(t *testing.T, c *testserver.Clients, want int) {
	t.Helper()
	resp, err := c.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Msg.Nodes) != want {
		t.Fatalf("the tree has %d nodes, want %d (a refused request changed state)", len(resp.Msg.Nodes), want)
	}
}

func TestBadInputIsRefusedWithoutStateChange(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	stopped := spawn(t, admin, root.Node.NodeId, "stopped")
	// Stop one node directly in the store (terminations arrive in a later layer).
	err := srv.Store().Update(context.Background(), func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, stopped.Node.NodeId)
		if err != nil {
			return err
		}
		n.State = tree.NodeStateTerminated
		return tree.PutNodeIn(tx, n)
	})
	if err != nil {
		t.Fatal(err)
	}
	const before = 2
	ctx := context.Background()
	huge := strings.Repeat("x", 2<<20)
	cases := []struct {
		name  string
		call  func(c *testserver.Clients) error
		c     *testserver.Clients
		code  connect.Code
		field string
	}{
		{"empty name", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{}))
			return err
		}, admin, connect.CodeInvalidArgument, "name"},
		{"malformed name", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "../etc/passwd"}))
			return err
		}, admin, connect.CodeInvalidArgument, "name"},
		{"bad label key", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "ok", Labels: map[string]string{"bad key": "v"}}))
			return err
		}, admin, connect.CodeInvalidArgument, "labels"},
		{"oversized request", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "ok", Labels: map[string]string{"k": huge}}))
			return err
		}, admin, connect.CodeResourceExhausted, ""},
		{"malformed parent id", func(c *testserver.Clients) error {
			_, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: "nope", Name: "child"}))
			return err
		}, admin, connect.CodeInvalidArgument, "parent_node_id"},
		{"missing parent", func(c *testserver.Clients) error {
			_, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: "n_00000000000000000000", Name: "child"}))
			return err
		}, admin, connect.CodeNotFound, "n_00000000000000000000"},
		{"stopped parent", func(c *testserver.Clients) error {
			_, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: stopped.Node.NodeId, Name: "child"}))
			return err
		}, admin, connect.CodeFailedPrecondition, "parent_node_id"},
		{"unknown node", func(c *testserver.Clients) error {
			_, err := c.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: "n_00000000000000000000"}))
			return err
		}, admin, connect.CodeNotFound, ""},
		{"malformed node id", func(c *testserver.Clients) error {
			_, err := c.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: strings.Repeat("z", 500)}))
			return err
		}, admin, connect.CodeInvalidArgument, "node_id"},
		{"bad selector", func(c *testserver.Clients) error {
			_, err := c.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{LabelSelector: "novalue"}))
			return err
		}, admin, connect.CodeInvalidArgument, "label_selector"},
		{"missing token", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "ok"}))
			return err
		}, srv.Clients(""), connect.CodeUnauthenticated, ""},
		{"garbage token", func(c *testserver.Clients) error {
			_, err := c.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "ok"}))
			return err
		}, srv.Clients("garbage.token.value"), connect.CodeUnauthenticated, ""},
		{"terminated node's credential", func(c *testserver.Clients) error {
			_, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: stopped.Node.NodeId, Name: "child"}))
			return err
		}, srv.Clients(stopped.Credential), connect.CodeUnauthenticated, "terminated"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(tc.c)
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if tc.field != "" && !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("message %q does not name %q", err, tc.field)
			}
			if strings.Contains(err.Error(), srv.Admin) || strings.Contains(err.Error(), "eyJ") {
				t.Fatalf("error leaks a token: %q", err)
			}
			assertNodeCount(t, admin, before)
		})
	}
}

func TestHealthMetricsAndJWKS(t *testing.T) {
	srv := testserver.Start(t)
	for path, want := range map[string]string{
		"/healthz":               "ok",
		"/.well-known/jwks.json": `"kty":"OKP"`,
	} {
		resp, err := srv.HTTP.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("GET %s = %d %q, want %q", path, resp.StatusCode, body, want)
		}
	}
	register(t, srv.AdminClients(), "metered")
	// Refused at the Gate, before any interceptor: still observed.
	if _, err := srv.Clients("forged").Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a forged token: %v", err)
	}
	resp, err := srv.HTTP.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if !strings.Contains(body, `rpc_method="/tether.v1.AgentService/RegisterRoot"`) {
		t.Fatalf("/metrics has no RegisterRoot series:\n%.2000s", body)
	}
	if !strings.Contains(body, `rpc_code="unauthenticated",rpc_method="/tether.v1.AuthService/WhoAmI"`) {
		t.Fatalf("/metrics does not count the refused call:\n%.4000s", body)
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			if errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			break
		}
	}
	return b.String()
}

func TestRegistrationsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir)
	root := register(t, srv.AdminClients(), "durable")
	srv.Stop()
	again := testserver.StartIn(t, dir)
	got, err := again.AdminClients().Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Node.Name != "durable" {
		t.Fatalf("after restart: %v", got.Msg.Node)
	}
	// The same key ring signs after the restart: the old credential still works.
	if _, err := again.Clients(root.Credential).Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatalf("credential from before the restart: %v", err)
	}
}
