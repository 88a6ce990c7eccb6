package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tetherhq/tether"

// rule forbids packages matching From to depend, directly or through other
// packages, on packages matching To. Only non-test code counts: tests may
// assemble real parts from any layer.
type rule struct {
	why      string
	from, to []string // import-path prefixes; "..." matches the path and below
}

var rules = []rule{
	{
		why:  "the capability layer never imports the supervisor: grantstore declares the tree queries it needs and controlplane wires them",
		from: []string{module + "/capability/..."},
		to:   []string{module + "/supervisor/..."},
	},
	{
		why:  "the SDK speaks only the public API",
		from: []string{module + "/agentsdk/..."},
		to:   []string{module + "/controlplane/..."},
	},
	{
		why:  "domain packages reach storage through the contract (internal/store), never a backend",
		from: []string{module + "/capability/...", module + "/supervisor/..."},
		to: []string{
			module + "/internal/store/badgerstore/...", module + "/internal/store/etcdstore/...",
			"github.com/dgraph-io/badger/...", "go.etcd.io/etcd/...",
		},
	},
	{
		why:  "nothing under supervisor reaches up into the server: controlplane wires the supervisor's packages, never the reverse",
		from: []string{module + "/supervisor/..."},
		to:   []string{module + "/controlplane/..."},
	},
	{
		why:  "the agent tree, the ledger and the privileges sit below the termination: they never import it, nor what sits above it (rollouts, stop rules)",
		from: []string{module + "/supervisor/tree/...", module + "/supervisor/ledger/...", module + "/supervisor/privilege/..."},
		to:   []string{module + "/supervisor", module + "/supervisor/rollout/...", module + "/supervisor/stoprule/..."},
	},
	{
		why:  "the agent tree is the bottom of the supervisor: the ledger and the privileges read it, it reads neither",
		from: []string{module + "/supervisor/tree/..."},
		to:   []string{module + "/supervisor/ledger/...", module + "/supervisor/privilege/..."},
	},
	{
		why:  "domain packages hold their own types: conversion to the tether.v1 messages lives at the RPC edge (controlplane/wire), and what they store is written by internal/storecodec",
		from: []string{module + "/capability/...", module + "/supervisor/..."},
		to:   []string{module + "/proto/tether/v1/..."},
	},
	{
		why:  "the job-lease machine is a peer of the termination and the capability layer, below controlplane: it imports neither (controlplane reports its leases in the record)",
		from: []string{module + "/supervisor/lease/..."},
		to: []string{
			module + "/supervisor", module + "/supervisor/tree/...", module + "/supervisor/ledger/...", module + "/supervisor/privilege/...",
			module + "/supervisor/rollout/...", module + "/supervisor/stoprule/...", module + "/capability/...",
		},
	},
	{
		why:  "the termination sits below the rollouts and the stop rules, which start terminations: it never imports them",
		from: []string{module + "/supervisor"},
		to:   []string{module + "/supervisor/rollout/...", module + "/supervisor/stoprule/..."},
	},
	{
		why:  "domain packages say what went wrong with an error category (internal/fault); only the RPC edge knows connect and picks codes",
		from: []string{module + "/capability/...", module + "/supervisor/...", module + "/internal/store/...", module + "/internal/fault/..."},
		to:   []string{"connectrpc.com/..."},
	},
	{
		why: "nothing imports a command: what a command alone uses (the demo, the bench) lives under it, in its own internal/",
		from: []string{
			module + "/agentsdk/...", module + "/capability/...", module + "/controlplane/...", module + "/supervisor/...",
			module + "/internal/...", module + "/proto/...", module + "/examples/...",
		},
		to: []string{module + "/cmd/..."},
	},
	{
		why:  "internal/ is the ground every layer stands on (the store contract and backends, the clock, identifiers, error categories, codecs, test etcd): it imports no layer; harnesses that run a control plane live beside what they run (controlplane/testserver, controlplane/embedded) or under their command",
		from: []string{module + "/internal/..."},
		to: []string{
			module + "/controlplane/...", module + "/supervisor/...", module + "/capability/...", module + "/agentsdk/...",
			module + "/cmd/...",
		},
	},
}

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath string
	Deps       []string
}

// matches reports whether path is covered by pattern ("x/..." is x and
// everything below it; "..." is everything).
func matches(pattern, path string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchesAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, path) })
}

// violations lists every forbidden dependency among pkgs.
func violations(pkgs []pkg) []string {
	var out []string
	for _, r := range rules {
		for _, p := range pkgs {
			if !matchesAny(r.from, p.ImportPath) {
				continue
			}
			for _, d := range p.Deps {
				if matchesAny(r.to, d) {
					out = append(out, fmt.Sprintf("%s depends on %s: %s", p.ImportPath, d, r.why))
				}
			}
		}
	}
	return out
}

// listModule runs `go list -json ./...` at the module root.
func listModule(t *testing.T) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-json=ImportPath,Deps", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestDependenciesRunOneWay fails when a forbidden dependency appears.
func TestDependenciesRunOneWay(t *testing.T) {
	pkgs := listModule(t)
	// The rules must be about packages that exist: a rename that leaves a
	// rule matching nothing would silently disable it.
	for _, want := range []string{
		module + "/capability/grantstore", module + "/supervisor", module + "/supervisor/tree", module + "/supervisor/ledger",
		module + "/supervisor/privilege", module + "/supervisor/rollout", module + "/supervisor/stoprule",
		module + "/agentsdk", module + "/internal/store", module + "/cmd/tether",
	} {
		if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.ImportPath == want }) {
			t.Fatalf("go list did not report %s; the rules would check nothing", want)
		}
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestRulesBite feeds the checker the dependencies each rule forbids and
// checks it reports every one, and none of the allowed ones.
func TestRulesBite(t *testing.T) {
	bad := []pkg{
		{ImportPath: module + "/capability/grantstore", Deps: []string{module + "/supervisor"}},
		{ImportPath: module + "/agentsdk/mcpgate", Deps: []string{module + "/controlplane/auth"}},
		{ImportPath: module + "/supervisor/lease/coordinator", Deps: []string{module + "/internal/store/badgerstore"}},
		{ImportPath: module + "/supervisor", Deps: []string{"go.etcd.io/etcd/client/v3"}},
		{ImportPath: module + "/capability", Deps: []string{"github.com/dgraph-io/badger/v4"}},
		{ImportPath: module + "/controlplane/testserver", Deps: []string{module + "/cmd/tether"}},
		{ImportPath: module + "/internal/store", Deps: []string{module + "/supervisor/tree"}},
		{ImportPath: module + "/supervisor/stoprule", Deps: []string{module + "/controlplane/auth"}},
		{ImportPath: module + "/supervisor/tree", Deps: []string{module + "/supervisor"}},
		{ImportPath: module + "/supervisor/ledger", Deps: []string{module + "/supervisor/rollout"}},
		{ImportPath: module + "/supervisor/privilege", Deps: []string{module + "/supervisor/stoprule"}},
		{ImportPath: module + "/supervisor/tree", Deps: []string{module + "/supervisor/ledger"}},
		{ImportPath: module + "/supervisor", Deps: []string{module + "/supervisor/rollout"}},
		{ImportPath: module + "/supervisor/stoprule", Deps: []string{"connectrpc.com/connect"}},
		{ImportPath: module + "/supervisor/ledger", Deps: []string{module + "/proto/tether/v1"}},
		{ImportPath: module + "/supervisor", Deps: []string{module + "/proto/tether/v1"}},
		{ImportPath: module + "/capability/grantstore", Deps: []string{module + "/proto/tether/v1"}},
		{ImportPath: module + "/supervisor/stoprule", Deps: []string{module + "/proto/tether/v1"}},
		{ImportPath: module + "/supervisor/lease/coordinator", Deps: []string{module + "/proto/tether/v1"}},
		{ImportPath: module + "/supervisor/lease/coordinator", Deps: []string{module + "/supervisor"}},
	}
	if got := violations(bad); len(got) != len(bad) {
		t.Errorf("violations found %d of %d forbidden dependencies: %q", len(got), len(bad), got)
	}
	good := []pkg{
		{ImportPath: module + "/capability/grantstore", Deps: []string{module + "/internal/store", module + "/capability", module + "/supervisorx"}},
		{ImportPath: module + "/controlplane", Deps: []string{module + "/supervisor", module + "/internal/store/badgerstore", "go.etcd.io/etcd/client/v3"}},
		{ImportPath: module + "/agentsdk", Deps: []string{module + "/capability", module + "/proto/tether/v1"}},
		{ImportPath: module + "/supervisor/ledger", Deps: []string{module + "/supervisor/tree", module + "/supervisor/internal/kv"}},
		{ImportPath: module + "/supervisor", Deps: []string{module + "/supervisor/tree", module + "/supervisor/ledger", module + "/supervisor/privilege"}},
		{ImportPath: module + "/supervisor/rollout", Deps: []string{module + "/supervisor", module + "/supervisor/tree"}},
		{ImportPath: module + "/supervisor/stoprule", Deps: []string{module + "/supervisor", module + "/supervisor/lease"}},
		{ImportPath: module + "/agentsdk", Deps: []string{module + "/capability", module + "/internal/fault", module + "/proto/tether/v1", "connectrpc.com/connect"}},
		{ImportPath: module + "/controlplane/auth", Deps: []string{module + "/internal/fault", "connectrpc.com/connect"}},
		{ImportPath: module + "/cmd/tether", Deps: []string{module + "/cmd/tether/internal/demo", module + "/controlplane/embedded"}},
		{ImportPath: module + "/cmd/tether-bench/internal/bench", Deps: []string{module + "/controlplane", module + "/supervisor", module + "/internal/store"}},
	}
	if got := violations(good); len(got) != 0 {
		t.Errorf("violations reported allowed dependencies: %q", got)
	}
}
