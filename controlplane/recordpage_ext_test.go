package controlplane_test

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRecordReadInPagesThroughTheServer terminates a subtree of a few
// hundred agents in chunks of 8 and reads its record through GetRecord in
// pages of 7 entries: the pages put together equal the record read whole
// (every node exactly once), the following pages carry no header, and
// agentsdk.ReadRecord returns the whole record from pages. A page token
// altered, or named with another record, is refused as invalid_argument;
// an agent holding a genuine token still cannot read the record.
func TestRecordReadInPagesThroughTheServer(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.TerminationChunk = 8 })
	admin := srv.AdminClients()
	root := register(t, admin, "root").Node.NodeId
	want := map[string]bool{root: true}
	parents := []string{root}
	for i := 0; len(want) <= 300; i++ {
		n := spawn(t, admin, parents[i/6], fmt.Sprintf("agent-%d", i)).Node.NodeId
		want[n] = true
		parents = append(parents, n)
	}
	term := terminate(t, admin, root, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	whole, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.TerminationId}))
	if err != nil {
		t.Fatal(err)
	}
	if whole.Msg.NextPageToken != "" || len(whole.Msg.Record.Nodes) != len(want) {
		t.Fatalf("without a page size: %d nodes and next_page_token %q; want all %d in one answer", len(whole.Msg.Record.Nodes), whole.Msg.NextPageToken, len(want))
	}

	first, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.TerminationId, PageSize: 7}))
	if err != nil {
		t.Fatal(err)
	}
	got := first.Msg.Record
	seen := map[string]int{}
	count := func(r *tetherv1.ReconciliationRecord) {
		for _, n := range r.Nodes {
			seen[n.NodeId]++
		}
	}
	count(got)
	pages, token := 1, first.Msg.NextPageToken
	var second string
	for token != "" {
		if pages == 1 {
			second = token
		}
		resp, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{PageSize: 7, PageToken: token}))
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		p := resp.Msg.Record
		if p.RecordId != "" || len(p.Phases) != 0 || p.WrittenAt != nil {
			t.Fatalf("page %d carries the header", pages+1)
		}
		if n := len(p.Nodes) + len(p.ToolCalls) + len(p.Privileges) + len(p.Leases); n == 0 || n > 7 {
			t.Fatalf("page %d has %d entries, want 1 to 7", pages+1, n)
		}
		count(p)
		got.Nodes = append(got.Nodes, p.Nodes...)
		got.ToolCalls = append(got.ToolCalls, p.ToolCalls...)
		got.Privileges = append(got.Privileges, p.Privileges...)
		got.Leases = append(got.Leases, p.Leases...)
		pages++
		token = resp.Msg.NextPageToken
	}
	if pages < len(want)/7 {
		t.Fatalf("%d pages of 7 for %d nodes", pages, len(want))
	}
	for n := range want {
		if seen[n] != 1 {
			t.Fatalf("node %s is in the pages %d times, want once", n, seen[n])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("the pages list %d nodes, the subtree has %d", len(seen), len(want))
	}
	if !proto.Equal(got, whole.Msg.Record) {
		t.Fatal("the pages put together differ from the record read whole")
	}
	sdk, err := agentsdk.ReadRecord(ctx, admin.Supervisor, &tetherv1.GetRecordRequest{RecordId: whole.Msg.Record.RecordId, PageSize: 7})
	if err != nil || !proto.Equal(sdk, whole.Msg.Record) {
		t.Fatalf("agentsdk.ReadRecord in pages of 7: equal %v, %v", err == nil && proto.Equal(sdk, whole.Msg.Record), err)
	}

	// Another record, to name with the first record's token.
	other := register(t, admin, "other").Node.NodeId
	spawn(t, admin, other, "w")
	oterm := terminate(t, admin, other, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	waitState(t, srv, oterm.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	altered := []byte(second)
	altered[len(altered)/2] ^= 1
	for name, req := range map[string]*tetherv1.GetRecordRequest{
		"altered":                 {PageToken: string(altered)},
		"cut short":               {PageToken: second[:len(second)-3]},
		"for another termination": {TerminationId: oterm.TerminationId, PageToken: second},
		"not a token":             {PageToken: "page-2"},
	} {
		_, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s token: %v, want invalid_argument", name, err)
		}
	}
	// An agent holding a genuine token (its own record's or another's)
	// reads no record: the token adds nothing to what a caller may read.
	bystander := register(t, admin, "bystander")
	agent := srv.Clients(bystander.Credential)
	for _, req := range []*tetherv1.GetRecordRequest{{PageToken: second}, {TerminationId: term.TerminationId, PageToken: second}} {
		_, err := agent.Supervisor.GetRecord(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("an agent reading with a token: %v, want permission_denied", err)
		}
	}
	// The genuine token still reads after all that: nothing changed.
	if _, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{PageToken: second, PageSize: 7})); err != nil {
		t.Fatal(err)
	}
}
