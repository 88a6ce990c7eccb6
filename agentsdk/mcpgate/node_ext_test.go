package mcpgate_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
)

// nodeDir holds the node test, its package.json and its lockfile.
const nodeDir = "testdata/node"

// requireNode finds node and the node test's modules, or skips — unless
// TETHER_REQUIRE_NODE=1 (CI), where their absence fails the test.
func requireNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	missing := ""
	switch {
	case err != nil:
		missing = "node is not on the PATH"
	default:
		for _, m := range []string{"@modelcontextprotocol/sdk", "@modelcontextprotocol/server-filesystem"} {
			if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", m, "package.json")); err != nil {
				missing = m + " is not installed (run `npm ci` in agentsdk/mcpgate/" + nodeDir + ")"
			}
		}
	}
	if missing != "" {
		if os.Getenv("TETHER_REQUIRE_NODE") == "1" {
			t.Fatalf("TETHER_REQUIRE_NODE=1 but %s", missing)
		}
		t.Skipf("skipping the TypeScript SDK test: %s; set TETHER_REQUIRE_NODE=1 to make this a failure", missing)
	}
	return node
}

// The official TypeScript SDK's client drives the gateway over Streamable
// HTTP, with the Go SDK upstream and the third-party server-filesystem
// (stdio) behind it, and through `tether mcp wrap` over stdio.
func TestTypeScriptClientThroughTheGateway(t *testing.T) {
	node := requireNode(t)
	w := newWorld(t, "mcp:fs/read_*", "mcp:fs/list_*", "mcp:test/echo")
	fsDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(fsDir, "hello.txt"), []byte("hello from the filesystem server\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fsServer, err := filepath.Abs(filepath.Join(nodeDir, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"))
	if err != nil {
		t.Fatal(err)
	}
	gw := w.open(t, mcpgate.Upstream{Name: "test", URL: w.upstream}, mcpgate.Upstream{Name: "fs", Command: []string{node, fsServer, fsDir}})
	front := httptest.NewUnstartedServer(nil)
	front.Config.Handler = gw.Handler(mcpgate.HTTPOptions{BaseURL: "http://" + front.Listener.Addr().String()})
	front.Start()
	t.Cleanup(front.Close)

	cmd := exec.Command(node, "--test", "client.test.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(),
		"TETHER_MCP_URL="+front.URL+mcpgate.EndpointPath,
		"TETHER_CAPABILITY_TOKEN="+w.grant.Token,
		"FS_DIR="+fsDir,
		"FS_SERVER="+fsServer,
		"TETHER_BIN="+testserver.Binary(t),
		"TETHER_ADDR="+w.srv.URL,
		"TETHER_GATE_TOKEN="+w.srv.ToolServerToken(t, "mcp-wrap"),
		"TETHER_WRAP_GATE_ID=mcp-wrap",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "# fail 0") || strings.Contains(string(out), "# pass 0") {
		t.Fatalf("node --test ran nothing or failed:\n%s", out)
	}
	t.Logf("node --test:\n%s", out)
}
