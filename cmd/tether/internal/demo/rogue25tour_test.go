package demo

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"
)

// The demo announces two calls in flight (a quick test run, a long training
// job) and then the draining line said "0 tool call(s) in flight": it was
// printed from the first snapshot of the draining state, published when the
// subtree is marked, before the control plane counted the calls the mark
// caught. The README's story shows 2, the record lists both.
func TestRogue25TourDemoCountsTheCallsInFlight(t *testing.T) {
	var out bytes.Buffer
	if _, err := Run(context.Background(), Options{Workers: 2, Mode: "drain", Seed: 7, DrainWindow: time.Second, Dir: t.TempDir()}, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`(?m)^  draining +\d+ nodes marked in one transaction, (\d+) tool call\(s\) in flight`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no draining line in the story:\n%s", out.String())
	}
	if m[1] != "2" {
		t.Errorf("the draining line counts %s call(s) in flight, want the 2 the swarm had running:\n%s", m[1], out.String())
	}
}
