package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// TestDemoTellsTheWholeStory runs the demo scenario and checks its facts
// from the JSON record it wrote: a completed, a cancelled and a rejected
// tool call; revoked and expired privileges; confirmed children; the rogue
// and its parent unaccounted; and the rogue's next call refused.
func TestDemoTellsTheWholeStory(t *testing.T) {
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{Workers: 2, Mode: "drain", Seed: 7, DrainWindow: time.Second, Dir: t.TempDir()}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	raw, err := os.ReadFile(res.RecordPath)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Nodes []struct {
			NodeID            string `json:"nodeId"`
			ParentNodeID      string `json:"parentNodeId"`
			Outcome           string `json:"outcome"`
			UnaccountedReason string `json:"unaccountedReason"`
		} `json:"nodes"`
		ToolCalls []struct {
			Resolution string `json:"resolution"`
		} `json:"toolCalls"`
		Privileges []struct {
			Kind    string `json:"kind"`
			Outcome string `json:"outcome"`
		} `json:"privileges"`
		Leases []struct {
			Outcome string `json:"outcome"`
		} `json:"leases"`
		Escalated bool `json:"escalated"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, c := range rec.ToolCalls {
		calls[c.Resolution]++
	}
	for _, want := range []string{"CALL_RESOLUTION_COMPLETED", "CALL_RESOLUTION_CANCELLED_ACKED", "CALL_RESOLUTION_REJECTED_DRAINING"} {
		if calls[want] == 0 {
			t.Errorf("no %s call in the record (%v)\n%s", want, calls, out.String())
		}
	}
	privs := map[string]int{}
	for _, p := range rec.Privileges {
		privs[p.Outcome]++
	}
	if privs["PRIVILEGE_OUTCOME_REVOKED"] == 0 || privs["PRIVILEGE_OUTCOME_EXPIRED"] == 0 {
		t.Errorf("privileges %v: want revoked and expired ones", privs)
	}
	// The rogue ignores the drain, its session open through the record;
	// its parent and the planner, which exited, hold credentials it may
	// have been spawned with (each node is issued its child's credential
	// at the spawn, and with it may spawn below and take each credential
	// that spawn issues), and the control plane cannot tell the rogue's
	// session from their work: neither's claim is corroborated
	// (thirtieth pass for the parent, thirty-first for every ancestor),
	// each reason naming the rogue. The other four exited, confirmed.
	confirmed, unaccounted, parentOf := 0, map[string]string{}, map[string]string{}
	for _, n := range rec.Nodes {
		switch n.Outcome {
		case "NODE_OUTCOME_CONFIRMED":
			confirmed++
		case "NODE_OUTCOME_UNACCOUNTED":
			unaccounted[n.NodeID] = n.UnaccountedReason
		}
		parentOf[n.NodeID] = n.ParentNodeID
	}
	if len(rec.Nodes) != 7 {
		t.Errorf("record lists %d nodes, want 7 (planner, 2 workers, 4 sub-agents)", len(rec.Nodes))
	}
	rogueParent := parentOf[res.RogueNode]
	planner := parentOf[rogueParent]
	if _, ok := unaccounted[res.RogueNode]; !ok || len(unaccounted) != 3 {
		t.Errorf("unaccounted %v, want exactly the rogue %s, its parent %s and the planner %s", unaccounted, res.RogueNode, rogueParent, planner)
	}
	for _, ancestor := range []string{rogueParent, planner} {
		if !strings.Contains(unaccounted[ancestor], res.RogueNode) {
			t.Errorf("the rogue's ancestor %s: %q, want unaccounted, naming the rogue %s", ancestor, unaccounted[ancestor], res.RogueNode)
		}
	}
	if confirmed != 4 {
		t.Errorf("%d confirmed, want 4", confirmed)
	}
	if len(rec.Leases) != 2 {
		t.Errorf("record lists %d leases, want 2", len(rec.Leases))
	}
	if !rec.Escalated {
		t.Error("the stuck call should have made the drain escalate")
	}
	if res.RogueAfter != connect.CodePermissionDenied {
		t.Errorf("the rogue's call after termination: %v, want permission_denied", res.RogueAfter)
	}
	if !strings.Contains(out.String(), "UNACCOUNTED (3)") {
		t.Errorf("the story does not show the unaccounted rogue:\n%s", out.String())
	}
}

// TestMCPDemoDrainsOneCallAndAbortsAnother runs the MCP story and checks
// its record: one call completed in the drain window, one refused while
// draining, one cancelled and acknowledged, all reported by the gateway.
func TestMCPDemoDrainsOneCallAndAbortsAnother(t *testing.T) {
	var out bytes.Buffer
	res, err := RunMCP(context.Background(), Options{DrainWindow: time.Second, Dir: t.TempDir()}, &out)
	if err != nil {
		t.Fatalf("demo --mcp: %v\n%s", err, out.String())
	}
	got := map[string]string{}
	for _, c := range res.Record.ToolCalls {
		if c.GateId != "mcp-gateway" {
			t.Errorf("call %s reported by %q, want the gateway", c.CallId, c.GateId)
		}
		got[c.Tool+" "+c.Resolution.String()] = c.CallId
	}
	for _, want := range []string{
		"research/slow CALL_RESOLUTION_COMPLETED",
		"research/slow CALL_RESOLUTION_CANCELLED_ACKED",
		"research/echo CALL_RESOLUTION_REJECTED_DRAINING",
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("record lacks %s; has %v\n%s", want, got, out.String())
		}
	}
	if len(res.Record.ToolCalls) != 3 {
		t.Errorf("record lists %d calls, want 3", len(res.Record.ToolCalls))
	}
}
