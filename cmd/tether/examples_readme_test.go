package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// readmeBlocks returns the ```sh blocks of section (a "## " heading's text)
// in examples/README.md, joined.
func readmeBlocks(t *testing.T, readme, section string) string {
	t.Helper()
	start := strings.Index(readme, "\n## "+section)
	if start < 0 {
		t.Fatalf("examples/README.md has no section %q", section)
	}
	text := readme[start+4:]
	if end := strings.Index(text, "\n## "); end >= 0 {
		text = text[:end]
	}
	var out []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in:
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		t.Fatalf("section %q of examples/README.md has no sh block", section)
	}
	return strings.Join(out, "\n")
}

// TestExamplesReadmeAgentAndToolServer runs the commands examples/README.md
// gives for examples/toolserver and examples/agent, as written (the
// examples built first, their long-running commands in the background, the
// tool's port a free one): the agent's calls reach the tool through the
// gate, and the README's stop commands drain it and show its record.
func TestExamplesReadmeAgentAndToolServer(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("builds and runs the binaries")
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	b, err := os.ReadFile(filepath.Join(repo, "examples", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	binDir := filepath.Dir(testserver.Binary(t))
	for _, ex := range []string{"agent", "toolserver"} {
		build := exec.Command("go", "build", "-o", filepath.Join(binDir, "example-"+ex), "./examples/"+ex)
		build.Dir = repo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build examples/%s: %v\n%s", ex, err, out)
		}
	}
	dir := t.TempDir()
	addr := testserver.FreeAddr(t)
	testserver.StartProcessOn(t, filepath.Join(dir, "tether-data"), addr)
	toolAddr := testserver.FreeAddr(t)

	runs := strings.NewReplacer(
		"go run ./examples/toolserver", "example-toolserver",
		"go run ./examples/agent", "example-agent",
		"127.0.0.1:8081", toolAddr,
	)
	background := func(block, name string) string {
		var lines []string
		for _, line := range strings.Split(runs.Replace(block), "\n") {
			if strings.HasPrefix(line, "example-") {
				line += " > " + name + ".out 2>&1 &\necho $! >> pids"
			}
			lines = append(lines, line)
		}
		return strings.Join(lines, "\n")
	}
	stop := readmeBlocks(t, readme, "examples/agent")
	agentBlock, stopBlock, ok := strings.Cut(stop, "\nTERMINATION=")
	if !ok {
		t.Fatal("the examples/agent section no longer stops the agent with TERMINATION=$(tether terminate ...)")
	}
	// Wait for a condition (the agent's first answered call), bounded.
	waitFor := func(what, file string) string {
		return `for i in $(seq 1 300); do grep -q '` + what + `' ` + file + ` 2>/dev/null && break; sleep 0.1; done
grep -q '` + what + `' ` + file + ` || { echo "never saw: ` + what + `"; cat ` + file + `; exit 1; }
`
	}
	script := "set -e\ntrap 'kill $(cat pids) 2>/dev/null || true' EXIT\n: > pids\n" +
		background(readmeBlocks(t, readme, "examples/toolserver"), "toolserver") + "\n" +
		waitFor(`tool "echo" on`, "toolserver.out") +
		background(agentBlock, "agent") + "\n" +
		waitFor("tool answered 200", "agent.out") +
		"TERMINATION=" + stopBlock + "\n" +
		waitFor("exited", "agent.out")
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", script)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + dir,
		"TETHER_ADDR=" + addr, // without a scheme, as users type it
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		agentLog, _ := os.ReadFile(filepath.Join(dir, "agent.out"))
		t.Fatalf("the README's commands failed: %v\n%s\nagent:\n%s", err, out, agentLog)
	}
	for _, want := range []string{"Reconciliation record r_", "mode drain", "Nodes: 1 confirmed, 0 unaccounted"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the record the README shows lacks %q:\n%s", want, out)
		}
	}
}
