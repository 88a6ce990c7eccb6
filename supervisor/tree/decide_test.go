package tree_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/supervisor/tree"
)

var updateDecide = flag.Bool("update", false, "rewrite testdata/decide.txt from MayDecide")

// TestMayDecideTranscript replays MayDecide over every node state and
// every decision and compares the verdicts, refusals in full, with the
// transcript in testdata/decide.txt: only a running agent decides about
// work it does not hold; a draining, aborting, terminated or exited one is
// refused as stopping (a precondition), naming itself, its state and the
// decision. A running agent below an ancestor being stopped is refused as
// well, naming the ancestor (MayDecideUnder).
func TestMayDecideTranscript(t *testing.T) {
	var b strings.Builder
	b.WriteString("# state decision -> verdict (MayDecide; go test -run TestMayDecideTranscript -update rewrites it)\n")
	states := []tree.NodeState{tree.NodeStateRunning, tree.NodeStateDraining, tree.NodeStateAborting, tree.NodeStateTerminated, tree.NodeStateExited}
	decisions := []string{tree.DecideOffer, tree.DecideReassign, tree.DecideRequestCancel, tree.DecideResolve, tree.DecideClaim}
	for _, s := range states {
		for _, d := range decisions {
			err := tree.MayDecide(&tree.Node{NodeID: "n_parent", State: s}, d)
			verdict := "allowed"
			if err != nil {
				verdict = fmt.Sprintf("refused %s: %v", fault.KindOf(err), err)
			}
			fmt.Fprintf(&b, "%s %s -> %s\n", tree.StateName(s), d, verdict)
		}
	}
	// A running node below an ancestor being stopped, before the
	// termination's mark reaches it (MayDecideUnder): refused, naming the
	// ancestor; below a running or exited one (nil) it decides.
	// A stop requested and not yet marked covers the node too, on an
	// ancestor or on the node itself.
	covers := []struct {
		name  string
		cover *tree.Cover
	}{
		{"below draining", &tree.Cover{NodeID: "n_parent", State: "draining", TerminationID: "t_1"}},
		{"below aborting", &tree.Cover{NodeID: "n_parent", State: "aborting", TerminationID: "t_1"}},
		{"below terminated", &tree.Cover{NodeID: "n_parent", State: "terminated", TerminationID: "t_1"}},
		{"below exited marked", &tree.Cover{NodeID: "n_parent", State: "exited", TerminationID: "t_1"}},
		{"below requested", &tree.Cover{NodeID: "n_parent", State: tree.CoverRequested, TerminationID: "t_1"}},
		{"itself requested", &tree.Cover{NodeID: "n_child", State: tree.CoverRequested, TerminationID: "t_1"}},
	}
	for _, c := range covers {
		for _, d := range decisions {
			err := tree.MayDecideUnder(&tree.Node{NodeID: "n_child", State: tree.NodeStateRunning}, c.cover, d)
			verdict := "allowed"
			if err != nil {
				verdict = fmt.Sprintf("refused %s: %v", fault.KindOf(err), err)
			}
			fmt.Fprintf(&b, "running %s %s -> %s\n", c.name, d, verdict)
		}
	}
	if err := tree.MayDecideUnder(&tree.Node{NodeID: "n_child", State: tree.NodeStateRunning}, nil, tree.DecideResolve); err != nil {
		t.Errorf("a running node below no stopping ancestor: %v", err)
	}
	path := filepath.Join("testdata", "decide.txt")
	if *updateDecide {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		t.Fatalf("MayDecide's transcript differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}
