package tree_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherhq/tether/supervisor/tree"
)

var updateCover = flag.Bool("update-cover", false, "rewrite testdata/cover.txt from CoverOf")

// TestCoverOfTranscript replays CoverOf over lineages (root first, the
// running node last) and compares which stop covers the node with the
// transcript in testdata/cover.txt: the nearest ancestor stopping or
// stopped (an exited one only once a termination marked it), else the
// nearest stop requested on the lineage, the node's own included; nothing
// for a lineage outside every stop, or below an exited ancestor no
// termination marked.
func TestCoverOfTranscript(t *testing.T) {
	type stop = tree.LineageStop
	run := tree.NodeStateRunning
	cases := []struct {
		name    string
		lineage []stop
	}{
		{"a root, nothing requested", []stop{{NodeID: "n", State: run}}},
		{"a root, its own stop requested", []stop{{NodeID: "n", State: run, Requested: "t_op"}}},
		{"parent requested", []stop{{NodeID: "g", State: run}, {NodeID: "p", State: run, Requested: "t_op"}, {NodeID: "n", State: run}}},
		{"grandparent requested, parent requested later", []stop{{NodeID: "g", State: run, Requested: "t_op"}, {NodeID: "p", State: run, Requested: "t_agent"}, {NodeID: "n", State: run}}},
		{"grandparent draining, parent requested", []stop{{NodeID: "g", State: tree.NodeStateDraining, TerminationID: "t_op"}, {NodeID: "p", State: run, Requested: "t_agent"}, {NodeID: "n", State: run}}},
		{"grandparent aborting, parent running", []stop{{NodeID: "g", State: tree.NodeStateAborting, TerminationID: "t_op"}, {NodeID: "p", State: run}, {NodeID: "n", State: run}}},
		{"parent terminated", []stop{{NodeID: "p", State: tree.NodeStateTerminated, TerminationID: "t_op"}, {NodeID: "n", State: run}}},
		{"parent exited outside every stop", []stop{{NodeID: "p", State: tree.NodeStateExited}, {NodeID: "n", State: run}}},
		{"parent exited and marked", []stop{{NodeID: "p", State: tree.NodeStateExited, TerminationID: "t_op"}, {NodeID: "n", State: run}}},
		{"parent exited, its stop requested", []stop{{NodeID: "p", State: tree.NodeStateExited, Requested: "t_op"}, {NodeID: "n", State: run}}},
		{"grandparent draining, parent exited and marked by another", []stop{{NodeID: "g", State: tree.NodeStateDraining, TerminationID: "t_op"}, {NodeID: "p", State: tree.NodeStateExited, TerminationID: "t_other"}, {NodeID: "n", State: run}}},
	}
	var b strings.Builder
	b.WriteString("# lineage (root first, the node last) -> the stop covering the node (CoverOf; go test -run TestCoverOfTranscript -update-cover rewrites it)\n")
	for _, c := range cases {
		var parts []string
		for _, s := range c.lineage {
			p := s.NodeID + ":" + tree.StateName(s.State)
			if s.TerminationID != "" {
				p += "(" + s.TerminationID + ")"
			}
			if s.Requested != "" {
				p += "+requested(" + s.Requested + ")"
			}
			parts = append(parts, p)
		}
		at, requested := tree.CoverOf(c.lineage)
		verdict := "not covered"
		switch {
		case at >= 0 && requested:
			verdict = fmt.Sprintf("covered by the request %s on %s", c.lineage[at].Requested, c.lineage[at].NodeID)
		case at >= 0:
			verdict = fmt.Sprintf("covered by %s, %s under %s", c.lineage[at].NodeID, tree.StateName(c.lineage[at].State), c.lineage[at].TerminationID)
		}
		fmt.Fprintf(&b, "%s: %s -> %s\n", c.name, strings.Join(parts, " "), verdict)
	}
	path := filepath.Join("testdata", "cover.txt")
	if *updateCover {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		t.Fatalf("CoverOf's transcript differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}
