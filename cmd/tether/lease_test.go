package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// tether runs the CLI in process against srv with token.
func tether(t *testing.T, srv *testserver.Server, token string, args ...string) string {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"--addr", srv.URL, "--token", token}, args...))
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("tether %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func TestLeaseCommands(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	child, err := srv.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	worker := child.Msg.Credential

	out := tether(t, srv, srv.Admin, "lease", "offer", "job-1", "--holder", child.Msg.Node.NodeId, "--duration", "1m", "-o", "json")
	var offered tetherv1.OfferResponse
	if err := jsonUnmarshal(out, &offered); err != nil {
		t.Fatalf("offer -o json: %v\n%s", err, out)
	}
	leaseID := offered.Lease.LeaseId
	if out := tether(t, srv, worker, "lease", "ack", "job-1", "--lease-id", leaseID, "--generation", "1"); !strings.Contains(out, "ACCEPTED ACKED") || !strings.Contains(out, "ACTIVE") {
		t.Fatalf("ack:\n%s", out)
	}
	tether(t, srv, worker, "lease", "renew", "job-1", "--lease-id", leaseID, "--generation", "1", "--sequence", "1")
	tether(t, srv, worker, "lease", "progress", "job-1", "--lease-id", leaseID, "--generation", "1", "--sequence", "14", "--value", "70%")
	if out := tether(t, srv, worker, "lease", "progress", "job-1", "--lease-id", leaseID, "--generation", "1", "--sequence", "12", "--value", "60%"); !strings.Contains(out, "REJECTED LATE_PROGRESS") {
		t.Fatalf("late progress:\n%s", out)
	}
	if out := tether(t, srv, srv.Admin, "lease", "cancel", "job-1", "--reason", "budget"); !strings.Contains(out, "ACCEPTED CANCEL_REQUESTED") {
		t.Fatalf("cancel:\n%s", out)
	}
	tether(t, srv, worker, "lease", "cancel-ack", "job-1", "--lease-id", leaseID, "--generation", "1")
	tether(t, srv, worker, "lease", "complete", "job-1", "--lease-id", leaseID, "--generation", "1", "--result", "cancelled")
	if out := tether(t, srv, srv.Admin, "lease", "show", "job-1"); !strings.Contains(out, "TERMINAL") || !strings.Contains(out, "acquire_time") || !strings.Contains(out, "transitions:") {
		t.Fatalf("show:\n%s", out)
	}

	out = tether(t, srv, srv.Admin, "lease", "evidence", "job-1", "-o", "csv")
	records, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Job ID", "Lease ID", "Generation", "Holder Identity", "Issued At", "Lease Duration", "Expires At",
		"ACK Deadline/State", "Renew Sequence/Time", "Progress Sequence/Value", "Cancel Requested/ACK", "Terminal Result",
		"Stale Generation", "Late Progress", "Lease Expired", "Ownership Conflict", "Decision", "Reason"}
	if strings.Join(records[0], "|") != strings.Join(want, "|") {
		t.Fatalf("csv header %q, want exactly the seed's columns", records[0])
	}
	if len(records) != 1+8 {
		t.Fatalf("%d csv rows, want 8 decisions", len(records)-1)
	}
	late := records[5]
	if late[16] != "REJECTED LATE_PROGRESS" || late[9] != "14 / 70%" || late[13] != "true" {
		t.Fatalf("the late progress row: %q", late)
	}
	if out := tether(t, srv, srv.Admin, "lease", "evidence", "job-1"); !strings.Contains(out, "LATE_PROGRESS") {
		t.Fatalf("evidence table:\n%s", out)
	}
	if out := tether(t, srv, srv.Admin, "lease", "evidence", "job-1", "-o", "json"); !strings.Contains(out, `"row": "8"`) && !strings.Contains(out, `"row":"8"`) {
		t.Fatalf("evidence json:\n%s", out)
	}
	if out := tether(t, srv, srv.Admin, "lease", "policy"); !strings.Contains(out, "clock source") || !strings.Contains(out, "extend") {
		t.Fatalf("policy:\n%s", out)
	}
	if out := tether(t, srv, srv.Admin, "lease", "list"); !strings.Contains(out, "job-1") {
		t.Fatalf("list:\n%s", out)
	}
	out = tether(t, srv, srv.Admin, "lease", "offer", "job-2", "--holder", child.Msg.Node.NodeId, "-o", "json")
	if err := jsonUnmarshal(out, &offered); err != nil {
		t.Fatal(err)
	}
	if out := tether(t, srv, srv.Admin, "lease", "reassign", "job-2", "--holder", child.Msg.Node.NodeId); !strings.Contains(out, "REASSIGNED") {
		t.Fatalf("reassign:\n%s", out)
	}
	if out := tether(t, srv, srv.Admin, "lease", "resolve", "job-2", "--result", "unresolved", "--bound", "1h"); !strings.Contains(out, "RESOLVED") || !strings.Contains(out, "UNRESOLVED until") {
		t.Fatalf("resolve:\n%s", out)
	}
}

func jsonUnmarshal(s string, m *tetherv1.OfferResponse) error {
	return protojson.Unmarshal([]byte(s), m)
}

// `tether lease evidence` follows the server's pages: a job with more rows
// than one page holds (1000) comes out whole, in order, as CSV.
func TestLeaseEvidenceFollowsPages(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	child, err := srv.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "long", HolderIdentity: child.Msg.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	worker := srv.Clients(child.Msg.Credential)
	if _, err := worker.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	// 1,200 progress reports in one batched Channel request.
	stream := worker.Lease.Channel(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	const reports = 1200
	req := &tetherv1.ChannelRequest{}
	for i := range reports {
		m := &tetherv1.ChannelRequest{CorrelationId: uint64(i + 1), Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{
			JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1, ProgressSequence: uint64(i + 1), ProgressValue: strconv.Itoa(i + 1)}}}
		if i == 0 {
			req = m
			continue
		}
		req.Batch = append(req.Batch, m)
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	for answered := 0; answered < reports; {
		resp, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		answered += 1 + len(resp.Batch)
	}
	out := tether(t, srv, srv.Admin, "lease", "evidence", "long", "-o", "csv")
	records, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(records)-1, 2+reports; got != want {
		t.Fatalf("%d csv rows, want %d (offer, ack and every progress report)", got, want)
	}
	for i, r := range records[3:] {
		if want := fmt.Sprintf("%d / %d", i+1, i+1); r[9] != want {
			t.Fatalf("csv row %d has progress %q, want %q", i+3, r[9], want)
		}
	}
}

// `tether lease evidence` shows, below the rows, what each former holder
// sent after it stopped holding the job: a rogue former holder that
// floods its old generation has its first messages kept as rows and the
// rest counted, and the table says how many of each.
func TestLeaseEvidenceShowsFormerHoldersLateMessages(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "planner"}))
	if err != nil {
		t.Fatal(err)
	}
	spawnWorker := func(name string) *tetherv1.SpawnResponse {
		t.Helper()
		w, err := srv.Clients(root.Msg.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return w.Msg
	}
	w1, w2 := spawnWorker("w1"), spawnWorker("w2")
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "moved", HolderIdentity: w1.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	rogue := srv.Clients(w1.Credential)
	if _, err := rogue.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1})); err != nil {
		t.Fatal(err)
	}
	if out := tether(t, srv, srv.Admin, "lease", "evidence", "moved"); strings.Contains(out, "Late messages of former holders") {
		t.Fatalf("a job without former holders shows late messages:\n%s", out)
	}
	if _, err := admin.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: "moved", HolderIdentity: w2.Node.NodeId, Reason: "moved"})); err != nil {
		t.Fatal(err)
	}
	const kept, folded = coordinator.StaleRowsPerFormerHolder, 7
	for seq := uint64(1); seq <= kept+folded; seq++ {
		if _, err := rogue.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: 1, RenewSequence: seq})); err != nil {
			t.Fatalf("stale renew %d: %v", seq, err)
		}
	}
	out := tether(t, srv, srv.Admin, "lease", "evidence", "moved")
	want := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w1.Node.NodeId) + fmt.Sprintf(`\s+%d\s+%d\s*$`, kept, folded))
	if !strings.Contains(out, "Late messages of former holders") || !want.MatchString(out) {
		t.Fatalf("evidence table does not show %s's %d kept and %d folded late messages:\n%s", w1.Node.NodeId, kept, folded, out)
	}
}
