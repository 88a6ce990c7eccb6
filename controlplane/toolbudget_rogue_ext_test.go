package controlplane_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A tool server's gate asks the control plane about every capability token
// it is shown (BeginCall). Were each of those asks charged to the gate's
// own rate budget, one rogue caller of the gate — sending made-up tokens,
// or its own valid token over and over — would spend what every caller of
// the gate shares, and every agent's calls through it would be refused.
// A BeginCall is charged to whoever the call belongs to: a valid token's
// call to its holder's lineage, and a token that does not verify to the
// gate's own refusal budget, which refuses nothing else. Each test plays
// the rogue through the real server (Badger on disk, HTTP/2, real JWTs, a
// real ToolGate where it is the gate, the manual clock: budgets never
// refill).

// budgetServer starts a server whose budgets are 16 requests, never
// refilled (the clock does not move).
func budgetServer(t *testing.T) *testserver.Server {
	t.Helper()
	return testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 16 })
}

// realGate is an agentsdk.ToolGate with its own tool-server credential.
func realGate(t *testing.T, srv *testserver.Server, name string) *agentsdk.ToolGate {
	t.Helper()
	gate := agentsdk.NewToolGate(agentsdk.Dial(srv.URL, srv.ToolServerToken(t, name), agentsdk.WithHTTPClient(srv.HTTP)), name)
	t.Cleanup(gate.Close)
	<-gate.Ready()
	return gate
}

// forged is token with one character of its signature changed: well
// formed, signed by a key the server knows, and not verifying.
func forged(token string, n int) string {
	i := len(token) - 2 - n%40
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	return token[:i] + string(c) + token[i+1:]
}

// floodUntilRefused calls through the gate with tokens from next until a
// call is refused resource_exhausted, and returns that refusal.
func floodUntilRefused(t *testing.T, gate *agentsdk.ToolGate, next func(i int) string) *connect.Error {
	t.Helper()
	for i := range 64 {
		err := gate.Call(context.Background(), next(i), "shell", func(context.Context) error { return nil })
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			var ce *connect.Error
			errors.As(err, &ce)
			return ce
		}
	}
	t.Fatal("the flood was never refused; the probe tests nothing")
	return nil
}

// callBegins reports whether a call with token through the gate begins and
// runs.
func callBegins(t *testing.T, gate *agentsdk.ToolGate, token, who string) {
	t.Helper()
	ran := false
	if err := gate.Call(context.Background(), token, "shell", func(context.Context) error { ran = true; return nil }); err != nil {
		t.Fatalf("%s's call through the gate the rogue flooded: %v", who, err)
	}
	if !ran {
		t.Fatalf("%s's call through the gate did not run", who)
	}
}

// A rogue agent sends a shared gate made-up tokens — garbage and forged
// copies of its own — until the gate's refusals are spent. An honest
// agent's call through the same gate still begins.
func TestARogueFloodingAGateWithMadeUpTokensDoesNotFreezeOtherAgentsCalls(t *testing.T) {
	srv := budgetServer(t)
	admin := srv.AdminClients()
	honest := register(t, admin, "honest")
	rogue := register(t, admin, "rogue")
	honestToken := issueRoot(t, admin, honest.Node.NodeId, time.Hour, "tool:*").token
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	gate := realGate(t, srv, "shared-gate")

	refused := floodUntilRefused(t, gate, func(i int) string {
		if i%2 == 0 {
			return fmt.Sprintf("made-up-token-%d", i)
		}
		return forged(rogueToken, i)
	})
	callBegins(t, gate, honestToken, "the honest agent")
	if !strings.Contains(refused.Message(), "do not verify") {
		t.Fatalf("the flood's refusal: %q, want it to name the gate's refused tokens", refused.Message())
	}
}

// A rogue agent spends its own valid token at a shared gate, call after
// call. Its calls are its lineage's: the refusal names its lineage, its
// own next request elsewhere is refused too, and another lineage's call
// through the same gate still begins.
func TestARogueSpendingItsOwnTokenAtAGateSpendsItsOwnLineage(t *testing.T) {
	srv := budgetServer(t)
	admin := srv.AdminClients()
	honest := register(t, admin, "honest")
	rogue := register(t, admin, "rogue")
	honestToken := issueRoot(t, admin, honest.Node.NodeId, time.Hour, "tool:*").token
	rogueToken := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*").token
	gate := realGate(t, srv, "shared-gate")

	refused := floodUntilRefused(t, gate, func(int) string { return rogueToken })
	callBegins(t, gate, honestToken, "another lineage's agent")
	if want := "lineage " + rogue.Node.NodeId; !strings.Contains(refused.Message(), want) {
		t.Fatalf("the rogue's refusal: %q, want it to name %q", refused.Message(), want)
	}
	if refused.Meta().Get("Retry-After") == "" {
		t.Fatalf("the rogue's refusal carries no Retry-After: %v", refused)
	}
	_, err := srv.Clients(rogue.Credential).Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.Node.NodeId}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's own next request: %v, want resource_exhausted (its calls through the gate were its lineage's)", err)
	}
}

// Garbage tokens past the gate's refusal budget are refused
// resource_exhausted, with the retry hint (Retry-After, RetryInfo) and
// before any signature work for a token that cannot be one (its refusal
// is the budget's, not the token's), and change nothing in the store.
func TestGarbageTokensPastAGatesBudgetAreRefusedAndChangeNothing(t *testing.T) {
	srv := budgetServer(t)
	admin := srv.AdminClients()
	agent := register(t, admin, "agent")
	token := issueRoot(t, admin, agent.Node.NodeId, time.Hour, "tool:*").token
	gate := srv.Clients(srv.ToolServerToken(t, "shared-gate"))
	ctx := context.Background()
	begin := func(token string) error {
		_, err := gate.Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: token, Tool: "shell"}))
		return err
	}

	spent := false
	for i := range 64 {
		err := begin(fmt.Sprintf("garbage-%d", i))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			spent = true
			break
		}
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("garbage token %d: %v, want permission_denied until the budget is spent", i, err)
		}
	}
	if !spent {
		t.Fatal("the gate's refusals were never spent; the probe tests nothing")
	}
	before := storeDigest(t, srv)
	for i, garbage := range []string{"", "x", "a.b.c", strings.Repeat("A", 9000), forged(token, 3), forged(token, 7)} {
		err := begin(garbage)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
			t.Fatalf("token %d past the budget: %v, want resource_exhausted", i, err)
		}
		if ce.Meta().Get("Retry-After") == "" {
			t.Fatalf("token %d's refusal carries no Retry-After", i)
		}
		hinted := false
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil {
				if _, ok := v.(*errdetails.RetryInfo); ok {
					hinted = true
				}
			}
		}
		if !hinted {
			t.Fatalf("token %d's refusal carries no RetryInfo", i)
		}
		if len(garbage) > 8 && strings.Contains(ce.Message(), garbage) {
			t.Fatalf("token %d's refusal repeats the token: %q", i, ce.Message())
		}
	}
	if after := storeDigest(t, srv); after != before {
		t.Fatal("refused garbage tokens changed the store")
	}
	// The gate's own calls are not the refusals' budget.
	if err := begin(token); err != nil {
		t.Fatalf("a valid token once the gate's refusals are spent: %v", err)
	}
}

// storeDigest hashes every key and value in the server's store but the
// lease shards' liveness times (leases/alive/<shard>), which the lease
// coordinator writes on its own schedule — its shards' first tick after
// start, which a loaded machine runs after a test's first digest — and no
// request changes.
func storeDigest(t *testing.T, srv *testserver.Server) [32]byte {
	t.Helper()
	h := sha256.New()
	err := srv.Store().View(context.Background(), func(tx store.ReadTxn) error {
		return tx.Scan(nil, nil, func(k, v []byte) error {
			if bytes.HasPrefix(k, []byte("leases/alive/")) {
				return nil
			}
			fmt.Fprintf(h, "%d:%s=%d:%s;", len(k), k, len(v), v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// A fenced tool server (agentsdk.Fence with IssuedGenerations) asks the
// coordinator about every generation a caller claims above the highest it
// saw, and a refused one raises nothing, so a caller can have it ask
// again and again. A rogue names made-up jobs, then its own job with a
// generation nobody was issued, until each is refused: both spend the
// tool server's refusals (a read is charged to the job's reads at that
// tool server only when it admits the generation named; rogue16lease
// test). An honest holder's new generation of another job is still
// admitted.
func TestARogueNamingJobsAtAFenceDoesNotFreezeOtherJobs(t *testing.T) {
	srv := budgetServer(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	honest := register(t, admin, "honest")
	rogue := register(t, admin, "rogue")
	offer := func(job, holder string) *tetherv1.Lease {
		resp, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(5 * time.Minute)}))
		if err != nil {
			t.Fatalf("offer %s: %v", job, err)
		}
		return resp.Msg.Lease
	}
	honestLease := offer("honest-job", honest.Node.NodeId)
	// The honest holder accepts: a fence admits only an ACTIVE generation.
	_, d := unary{srv.Clients(honest.Credential)}.send(t, ack(honestLease))
	wantDecision(t, "the honest holder's ack", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	offer("rogue-job", rogue.Node.NodeId)
	tool := agentsdk.Dial(srv.URL, srv.ToolServerToken(t, "fenced-tool"), agentsdk.WithHTTPClient(srv.HTTP))
	fence := agentsdk.Fence{Check: agentsdk.IssuedGenerations(tool)}

	flood := func(what string, admit func(i int) error) error {
		t.Helper()
		for i := range 64 {
			err := admit(i)
			if connect.CodeOf(err) == connect.CodeResourceExhausted {
				return err
			}
			if !errors.Is(err, agentsdk.ErrUnissuedGeneration) {
				t.Fatalf("%s %d: %v, want ErrUnissuedGeneration until refused", what, i, err)
			}
		}
		t.Fatalf("%s were never refused; the probe tests nothing", what)
		return nil
	}
	flood("made-up jobs", func(i int) error { return fence.AdmitContext(ctx, fmt.Sprintf("made-up-%d", i), 1) })
	err := flood("the rogue's job's unissued generations", func(int) error { return fence.AdmitContext(ctx, "rogue-job", 999) })
	if err := fence.AdmitContext(ctx, "honest-job", honestLease.LeaseGeneration); err != nil {
		t.Fatalf("the honest holder's generation at the fence the rogue flooded: %v", err)
	}
	if !strings.Contains(err.Error(), `job "rogue-job"`) || !strings.Contains(err.Error(), "requests refused") {
		t.Fatalf("the rogue's refusal: %v, want it to name its job and the tool server's refusals", err)
	}
	if fence.Highest("rogue-job") > 1 { // the coordinator's answer raises it to the issued generation, 1
		t.Fatalf("the rogue raised its job's fence to %d, above the generation issued", fence.Highest("rogue-job"))
	}
}
