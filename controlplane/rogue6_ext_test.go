package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The sixth rogue pass: the surfaces the first five trod least (the
// console's endpoints, the MCP gateway, grants at their edges, resources
// before authentication). Each test plays one rogue through the real server
// (Badger on disk, real HTTP, real JWTs, the manual clock).

// clientFrom is an HTTP/1.1 client whose connections leave from the
// loopback address local (127.0.0.0/8 is all this machine's), so that one
// test can play callers at two source addresses. It follows no redirect.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// signInAt posts token to the console's sign-in form and returns the status
// and the page.
func signInAt(t *testing.T, hc *http.Client, base, token string) (int, string) {
	t.Helper()
	resp, err := hc.PostForm(base+"/ui/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A rogue cannot lock the operators out of the console. The console checks
// a pasted token with WhoAmI through the API in process, and the API bounds
// per source address the requests that carry no valid credential. Every
// sign-in came from one address, "console", whoever posted it: a rogue
// posting garbage to /ui/signin (from anywhere, without any credential)
// spent that address's budget, and every operator's sign-in with a token
// the server had not verified yet was refused "rate limit for requests
// without a valid credential from console" for as long as the rogue went
// on — at ten posts a second, for ever, exactly when the operator needs the
// console to stop it. A sign-in is now charged to the address that posted
// it: the rogue exhausts its own, the operator signs in.
func TestARogueCannotLockOperatorsOutOfTheConsoleSignIn(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.AnonymousRateLimit = 1 })
	created, err := srv.AdminClients().Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_OPERATOR}))
	if err != nil {
		t.Fatal(err)
	}
	rogue, operator := clientFrom("127.0.0.2"), clientFrom("127.0.0.1")
	var page string
	for i := range 4 { // the burst is 2: the third and fourth are refused
		var status int
		status, page = signInAt(t, rogue, srv.URL, "garbage-token")
		if status != http.StatusUnauthorized {
			t.Fatalf("the rogue's sign-in %d: status %d, want 401:\n%s", i+1, status, page)
		}
	}
	if !strings.Contains(page, "rate limit for requests without a valid credential from 127.0.0.2") {
		t.Fatalf("the rogue's fourth sign-in was not charged to its own address:\n%s", page)
	}
	status, page := signInAt(t, operator, srv.URL, created.Msg.Token)
	if status != http.StatusSeeOther {
		t.Fatalf("the operator's sign-in from another address: status %d, want 303 (signed in):\n%s", status, page)
	}
}

// A coordinating agent cannot pass its own word in the evidence matrix for
// an operator's or the control plane's. The lineage that coordinates a job
// (the agent that offered it, and its ancestors) may cancel, reassign and
// resolve it; the evidence row of that decision said only "by the
// coordinator (reason …)", the reason being the caller's free text, so a
// rogue parent could resolve its child's job with the very words the
// control plane writes when an operator's termination finalises a lease
// ("the holder acknowledged the cancel request; terminated: …"), or sign
// it "operator:…", and the row, the job's terminal detail and GetLease read
// exactly as the operator's would. The reason of a coordinator's message
// now begins with the principal that sent it, whoever it is: the reviewer
// rebuilding the job's history sees who decided.
func TestARogueCoordinatorCannotPassItsResolutionForTheOperators(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	job := w.job()
	offered, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := offered.Msg.Lease
	if _, err := w.w1C.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	// The operator asks for the cancellation: its row names the operator.
	who, err := w.admin.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	cancel, err := w.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: "budget"}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the operator's cancel request", cancel.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
	if r := cancel.Msg.Decision.Reason; !strings.Contains(r, `(reason "`+who.Msg.Principal+`: budget")`) {
		t.Fatalf("the operator's cancel request does not name the operator: %s", r)
	}
	// The rogue parent resolves its child's job in the control plane's own
	// words, signed as an operator.
	forged := "the holder acknowledged the cancel request; terminated: " + who.Msg.Principal + " aborted the subtree"
	resolved, err := w.plannerC.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: job, Result: tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, Reason: forged}))
	if err != nil {
		t.Fatal(err)
	}
	wantDecision(t, "the rogue's resolution", resolved.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RESOLVED)
	signed := "agent:" + w.planner + ": " + forged
	rows := w.evidence(t, job)
	last := rows[len(rows)-1]
	if !strings.Contains(last.Reason, `(reason "`+signed+`")`) {
		t.Fatalf("the evidence row of the rogue's resolution does not name the rogue:\n%s", last.Reason)
	}
	if got := w.get(t, job).TerminalDetail; got != signed {
		t.Fatalf("the job's terminal detail = %q, want %q", got, signed)
	}
	// A reason at the size limit still fits once signed, cut on a
	// character boundary.
	job2 := w.job()
	if _, err := w.plannerC.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job2, HolderIdentity: w.w1, LeaseDuration: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 2048) // 4,096 bytes, the limit
	cancelled, err := w.plannerC.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job2, Reason: long}))
	if err != nil {
		t.Fatalf("a reason of the full 4,096 bytes: %v", err)
	}
	wantDecision(t, "a long cancel request", cancelled.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_CANCEL_REQUESTED)
	if r := cancelled.Msg.Decision.Reason; !strings.Contains(r, `(reason "agent:`+w.planner+`: é`) || !utf8.ValidString(r) {
		t.Fatalf("a long cancel request's reason: %.200s…", r)
	}
}

// A rogue cannot buy the stop-rule evaluator's time with a regular
// expression. A rule's worst-case cost is checked when it is attached, and
// CEL costs a match by the length of the pattern's text (four characters a
// state, it guesses); a counted repetition breaks the guess: a rule over
// the agent's own 32 labels matching "(?:[a-z]{0,100}){0,10}b" was
// estimated at a quarter of the budget and took 15 ms an evaluation (the
// text times a program of two thousand states). An agent may attach 64
// such rules to each node of its subtree, and the evaluator — one for the
// whole cluster — runs every rule in effect at a node whenever the node
// reports its counters, so the rogue could keep it busy, and the operators'
// rules on other trees would fire late. A match is now costed by its
// compiled program, and a pattern the expression computes (whose program
// is unknown until it runs) is refused; both refusals name the position,
// and nothing is stored. An ordinary pattern is still accepted.
func TestARogueCannotStallTheRuleEvaluatorWithARegularExpression(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	rogue := srv.Clients(root.Credential)
	ctx := context.Background()
	for _, tc := range []struct{ expression, want string }{
		{`observed.node_labels.exists(k, observed.node_labels[k].matches("(?:[a-z]{0,100}){0,10}b"))`, "more than the budget of 10000"},
		{`observed.node_name.matches("[a-z]{0,1000}b")`, "more than the budget of 10000"},
		{`observed.node_name.matches(observed.node_labels[?"pattern"].orValue("x"))`, "1:27: matches() takes a literal pattern"},
		{`matches(observed.node_name, observed.node_name + "{0,1000}")`, "1:8: matches() takes a literal pattern"},
	} {
		for _, c := range []*testserver.Clients{rogue, admin} {
			_, err := c.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "slow", Expression: tc.expression}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: %v, want invalid_argument mentioning %q", tc.expression, err, tc.want)
			}
		}
		_, err := rogue.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: root.Node.NodeId, Expression: tc.expression}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("TestStopRule %s: %v, want invalid_argument", tc.expression, err)
		}
	}
	all, err := admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{}))
	if err != nil || len(all.Msg.Rules) != 0 {
		t.Fatalf("refused rules changed state: %v %v", all.Msg.GetRules(), err)
	}
	addRule(t, rogue, &tetherv1.AddStopRuleRequest{NodeId: root.Node.NodeId, Name: "named", Expression: `observed.node_name.matches("^w[a-z]*$") && observed.calls > 10`})
}

// A rogue cannot make a rollout drain the fleet with nothing ready in its
// place. A batch counts as replaced when enough agents matching the target
// selector have reported ready, and a new batch starts while the drained
// agents not yet replaced stay within max_unavailable. Any agent may label
// its children like replacements and have them report ready: the rollout
// counted them, took its batches as replaced, and drained the operator's
// agents one batch after another with no replacement up. A replacement now
// counts only when an operator vouched for its tree (its root, which only
// operators register, matches the target), or for an agent the rollout
// drained in its own tree. The rogue's children do not count: the batch
// waits for a real replacement and the rollout pauses at the deadline
// saying so, the operator's second agent still running; once the operator's
// replacement is ready the rollout goes on.
func TestARogueCannotHaveARolloutDrainTheFleetWithFakeReplacements(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	a0 := registerLabelled(t, admin, "a0", map[string]string{"version": "v1"})
	a1 := registerLabelled(t, admin, "a1", map[string]string{"version": "v1"})
	rogue := registerLabelled(t, admin, "rogue", map[string]string{"team": "other"})
	rc := srv.Clients(rogue.Credential)

	r := startRollout(t, admin, &tetherv1.RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 1,
		DrainWindow: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), BatchDeadline: durationpb.New(5 * time.Minute)})
	r = waitRollout(t, srv, r.RolloutId, "to start a batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 1 })
	for i := range 3 {
		fake := spawnLabelled(t, rc, rogue.Node.NodeId, fmt.Sprintf("fake-%d", i), map[string]string{"version": "v2"})
		reportReady(t, srv.Clients(fake.Credential), fake.Node.NodeId)
	}
	term := r.Batches[0].TerminationId
	testserver.WaitFor(t, 20*time.Second, "the batch's termination to finish", func() bool {
		clk.Advance(2 * time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	clk.Advance(5 * time.Minute)
	r = waitRollout(t, srv, r.RolloutId, "to pause at the batch deadline (or, counting the rogue's children, go on)", func(r *tetherv1.Rollout) bool {
		return r.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || r.State == tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED || len(r.Batches) > 1
	})
	drainedFirst, other := a0.Node.NodeId, a1.Node.NodeId
	if r.Batches[0].NodeIds[0] == other {
		drainedFirst, other = other, drainedFirst
	}
	if n := getNode(t, admin, other); len(r.Batches) != 1 || n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the rollout started %d batches and %s is %s: the rogue's children labelled v2 were taken for replacements of %s", len(r.Batches), other, n.State, drainedFirst)
	}
	if r.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED || !strings.Contains(r.Reason, `0 of 1 replacements matching "version=v2" are ready`) {
		t.Fatalf("rollout %s, reason %q: want paused, no replacement ready", r.State, r.Reason)
	}
	// The operator's replacement is ready: the rollout goes on.
	reportReady(t, admin, registerLabelled(t, admin, "b0", map[string]string{"version": "v2"}).Node.NodeId)
	if _, err := admin.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: r.RolloutId})); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, srv, r.RolloutId, "to start its second batch", func(r *tetherv1.Rollout) bool { return len(r.Batches) == 2 })
}

// A client cannot hold an HTTP/2 connection by never finishing a request's
// headers. The header block of a stream is a HEADERS frame and as many
// CONTINUATION frames as the client likes, and until the last one arrives
// there is no stream: no request for the header timeout, and the
// connection reads frames all along. A rogue, before any credential,
// trickles a header field every 10 ms: the server, hearing no complete
// frame, pings it, and a client in the middle of a header block cannot
// answer (nothing may come between its frames); the connection is closed
// within the ping and idle timeouts, long before the header size limit.
// (It held.)
func TestAnHTTP2HeaderBlockThatNeverEndsIsClosed(t *testing.T) {
	srv := testserver.Start(t, tinyLimits)
	c := dial(t, hostOf(t, srv.URL))
	closed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, c); close(closed) }()
	frame := func(typ, flags byte, payload []byte) []byte {
		n := len(payload)
		h := []byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, 0, 0, 0, 1} // stream 1
		return append(h, payload...)
	}
	field := []byte{0x00, 3, 'x', '-', 'a', 1, 'a'} // a literal header "x-a: a"
	const headers, continuation, settings = 0x1, 0x9, 0x4
	start := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, settings, 0, 0, 0, 0, 0)
	start = append(start, frame(headers, 0, append([]byte{0x82, 0x84, 0x86}, field...))...) // GET / http, no END_HEADERS
	if _, err := c.Write(start); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for sent := 0; ; {
		select {
		case <-closed:
			// A field counts 32 bytes beyond its name and value (RFC 7541).
			if sent*(32+3+1) >= controlplane.DefaultConnLimits.MaxHeaderBytes*9/10 {
				t.Fatalf("closed only at the header size limit (%d fields sent)", sent)
			}
			return
		case <-deadline:
			t.Fatalf("the server kept a header block open for 20s (%d fields sent)", sent)
		case <-tick.C:
			if _, err := c.Write(frame(continuation, 0, field)); err == nil {
				sent++
			}
		}
	}
}

// A rogue cannot read another tree's stop rule by testing it. TestStopRule
// evaluates a stored rule (by id) against a node the caller may read, and
// answers whether it would fire and the values it reads; it checked the
// node, not the rule: a rogue holding the id of an operator's rule on
// another tree learnt that it exists, which fields it reads, and — trying
// its own self-reported counters against it — its thresholds. A rule an
// agent may not list is now answered as one that does not exist; a rule
// in effect at its node, inherited from an operator, it still may test.
func TestARogueCannotTestAnotherTreesRule(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	other := register(t, admin, "other")
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	foreign := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: other.Node.NodeId, Name: "spend", Expression: `self_reported.?spend_usd.orValue(0.0) > 250.0`})
	if _, err := rc.StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: rogue.Node.NodeId, Counters: map[string]float64{"spend_usd": 300}})); err != nil {
		t.Fatal(err)
	}
	_, err := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: foreign.RuleId}))
	_, missing := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: rogue.Node.NodeId, RuleId: "x_00000000000000000000"}))
	if connect.CodeOf(err) != connect.CodeNotFound || connect.CodeOf(missing) != connect.CodeNotFound {
		t.Fatalf("the rogue tests another tree's rule: %v (a rule that does not exist: %v), want not_found for both", err, missing)
	}
	// An operator's rule in effect at the rogue's node (inherited by its
	// child) is the rogue's to test.
	child := spawn(t, rc, rogue.Node.NodeId, "child")
	mine := addRule(t, admin, &tetherv1.AddStopRuleRequest{NodeId: rogue.Node.NodeId, Name: "spend", Expression: `self_reported.?spend_usd.orValue(0.0) > 250.0`})
	res, err := rc.StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: child.Node.NodeId, RuleId: mine.RuleId}))
	if err != nil || res.Msg.Result {
		t.Fatalf("the rogue tests its operator's rule on its child: %v, %v (want false: the child reported nothing)", res, err)
	}
}
