package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

const (
	// KillsEnv is how many times TestCrash kills the server (default 3).
	KillsEnv = "TETHER_CRASH_KILLS"
	// SeedEnv fixes the seed of the workload and the kill points.
	SeedEnv = "TETHER_CRASH_SEED"
)

// rpcTimeout bounds every call of the workload; a call that outlives it is
// recorded as unanswered.
const rpcTimeout = 15 * time.Second

// TestCrash is the crash harness (see the package documentation).
func TestCrash(t *testing.T) {
	kills := envInt(t, KillsEnv, 3)
	seed := int64(envInt(t, SeedEnv, int(time.Now().UnixNano()&0x7fffffff)))
	t.Logf("%s=%d %s=%d", KillsEnv, kills, SeedEnv, seed)
	h := newHarness(t, seed)
	for round := 1; round <= kills; round++ {
		h.runRound(round, true)
		if t.Failed() {
			t.Fatalf("stopping after round %d (seed %d)", round, seed)
		}
	}
	h.runRound(kills+1, false)
	h.checkLinearizable()
	h.report()
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// harness owns the server process and the workload's shared state. Its
// rng is used only by the test goroutine; each workload goroutine gets a
// generator seeded from it, so a seed fixes every choice (the interleaving
// and therefore the exact kill points still vary).
type harness struct {
	t     *testing.T
	seed  int64
	rng   *rand.Rand
	dir   string
	addr  string
	url   string
	proc  *testserver.Process
	hc    *http.Client
	admin *testserver.Clients
	// security revokes grants it did not issue (the role is in every
	// revoker set).
	security *testserver.Clients
	gate     *agentsdk.ToolGate
	// bg lives as long as the test: tool calls in flight across kills.
	bg       context.Context
	cancelBG context.CancelFunc
	epoch    time.Time

	leases *leaseLoad
	caps   *capLoad
	terms  *termLoad
	nodes  ackedSet

	// round is the current round; set before the workload starts.
	round                                       int
	kills                                       int
	calls, answered, unanswered, refused, reads atomic.Int64
	checkedNodes, checkedGrants, checkedRecords int
	checkedLeaseOps, introspected               int
}

func newHarness(t *testing.T, seed int64) *harness {
	dir := t.TempDir()
	h := &harness{t: t, seed: seed, rng: rand.New(rand.NewPCG(uint64(seed), 0x7e7e7e)), dir: dir,
		addr: testserver.FreeAddr(t), hc: testserver.H2CClient(), epoch: time.Now()}
	h.url = "http://" + h.addr
	h.bg, h.cancelBG = context.WithCancel(context.Background())
	h.nodes = newAckedSet()
	h.start()
	h.admin = testserver.NewClients(h.hc, h.url, h.proc.Admin)
	h.security = testserver.NewClients(h.hc, h.url, h.token(tetherv1.Role_ROLE_SECURITY))
	h.gate = agentsdk.NewToolGate(agentsdk.Dial(h.url, testserver.ToolServerToken(t, h.admin, "crash-gate"), agentsdk.WithHTTPClient(h.hc)), "crash-gate")
	<-h.gate.Ready()
	h.leases = newLeaseLoad(h)
	h.caps = newCapLoad(h)
	h.terms = newTermLoad(h)
	t.Cleanup(func() {
		h.cancelBG()
		h.terms.calls.Wait() // tool calls end (their reports may fail once the server is gone)
		h.gate.Close()
		h.proc.Kill()
	})
	return h
}

// start runs `tether serve` on the harness's directory and address. The
// rate limiter is off: the workload's admin calls all come from one
// principal.
func (h *harness) start() {
	h.proc = testserver.StartProcessOn(h.t, h.dir, h.addr, "--rate-limit", "0")
}

func (h *harness) token(role tetherv1.Role) string {
	resp, err := h.admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Subject: "crash-" + role.String()}))
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Msg.Token
}

// now is the harness's monotonic clock for histories.
func (h *harness) now() int64 { return int64(time.Since(h.epoch)) }

func (h *harness) clients(token string) *testserver.Clients {
	return testserver.NewClients(h.hc, h.url, token)
}

// call runs one workload RPC with the harness's timeout and counts it.
// answered reports whether the server answered (success or a definite
// refusal); err is the call's error.
func (h *harness) call(f func(ctx context.Context) error) (answered bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	h.calls.Add(1)
	err = f(ctx)
	switch {
	case err == nil:
		h.answered.Add(1)
		return true, nil
	case refusal(err):
		h.answered.Add(1)
		h.refused.Add(1)
		return true, err
	}
	h.unanswered.Add(1)
	return false, err
}

// refusal reports whether err is the server's definite answer that it did
// not apply the request (as opposed to a call cut off by the kill, whose
// effect is unknown).
func refusal(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodePermissionDenied,
		connect.CodeFailedPrecondition, connect.CodeOutOfRange, connect.CodeUnimplemented, connect.CodeUnauthenticated,
		connect.CodeResourceExhausted, connect.CodeAborted:
		return true
	}
	return false
}

// round runs the workload until a random number of further calls have
// been answered, then kills the server (when kill is set) at that point,
// stops the workload, restarts the server and checks every promise.
func (h *harness) runRound(n int, kill bool) {
	h.t.Helper()
	h.round = n
	stop := make(chan struct{})
	var wg sync.WaitGroup
	h.leases.run(&wg, stop, h.rng.Uint64())
	h.caps.run(&wg, stop, h.rng.Uint64())
	h.terms.run(&wg, stop, h.rng.Uint64())
	// The last round is long enough for every workload to finish its
	// scenario at least once.
	target := h.answered.Load() + int64(80+h.rng.IntN(320))
	if !kill {
		target += 400
	}
	testserver.WaitFor(h.t, 2*time.Minute, fmt.Sprintf("round %d's workload to reach %d answered calls", n, target), func() bool {
		return h.answered.Load() >= target
	})
	if kill {
		// A call sent after this instant cannot take effect: the server
		// would have to read, judge and persist it after SIGKILL.
		killedAt := h.now()
		close(stop) // no new calls; the ones in flight meet the kill
		h.proc.Kill()
		h.kills++
		wg.Wait()
		// Calls cut off by the kill may have been applied up to the kill,
		// never after: the process is gone.
		h.leases.rec.closeLife(killedAt)
		h.start()
	} else {
		// The last round ends without a kill: calls in flight finish.
		close(stop)
		wg.Wait()
		h.leases.rec.closeLife(h.now())
	}
	h.check(n, !kill)
}

// check verifies, against the restarted server, everything acknowledged
// so far. final also waits for every termination to finish.
func (h *harness) check(round int, final bool) {
	h.t.Helper()
	h.checkNodes(round)
	h.caps.check(round)
	h.terms.check(round, final)
	h.leases.readAll(round) // recorded in the history: checked by porcupine
}

// checkNodes: every acknowledged RegisterRoot and Spawn is present.
func (h *harness) checkNodes(round int) {
	h.t.Helper()
	present := map[string]bool{}
	page := ""
	for {
		resp, err := h.admin.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{PageToken: page}))
		if err != nil {
			h.t.Fatalf("round %d: list nodes: %v", round, err)
		}
		for _, n := range resp.Msg.Nodes {
			present[n.NodeId] = true
		}
		if page = resp.Msg.NextPageToken; page == "" {
			break
		}
	}
	for _, id := range h.nodes.list() {
		if !present[id] {
			h.t.Errorf("round %d: acknowledged node %s (%s) is missing after the restart", round, id, h.nodes.get(id))
		}
		h.checkedNodes++
	}
}

func (h *harness) checkLinearizable() {
	h.t.Helper()
	ops := h.leases.rec.history()
	res, info := porcupine.CheckOperationsVerbose(LeaseModel(), ops, 5*time.Minute)
	switch res {
	case porcupine.Ok:
		h.checkedLeaseOps = len(ops)
		return
	case porcupine.Unknown:
		h.t.Errorf("the lease history (%d operations) could not be checked in time", len(ops))
	default:
		h.t.Errorf("the lease history (%d operations) is not linearizable against the lease model", len(ops))
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("tether-crash-%d.html", h.seed))
	if err := porcupine.VisualizePath(LeaseModel(), info, path); err == nil {
		h.t.Logf("visualisation: %s", path)
	}
}

func (h *harness) report() {
	byOp := h.leases.rec.countByOp()
	keys := make([]string, 0, len(byOp))
	for k := range byOp {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	mix := ""
	for _, k := range keys {
		mix += fmt.Sprintf(" %s=%d", k, byOp[k])
	}
	h.t.Logf("crash harness (seed %d): %d kills; %d calls: %d answered (%d of them refusals the workload expects, such as confirming the exit of a node already terminated), %d without an answer (in flight at a kill, or sent before the workload noticed it)",
		h.seed, h.kills, h.calls.Load(), h.answered.Load(), h.refused.Load(), h.unanswered.Load())
	h.t.Logf("lease history: %d operations on %d jobs checked linearizable (%d unanswered; %d reads after restarts):%s",
		h.checkedLeaseOps, len(h.leases.jobs), h.leases.rec.unansweredCount(), h.reads.Load(), mix)
	h.t.Logf("acknowledged writes re-checked after every restart: %d node checks, %d grant checks, %d tokens introspected, %d records; %d terminations, %d nodes, %d grants, %d revocations acknowledged",
		h.checkedNodes, h.checkedGrants, h.introspected, h.checkedRecords, h.terms.count(), h.nodes.len(), h.caps.grantCount(), h.caps.revocationCount())
}

// ackedSet is a set of acknowledged ids with a label each.
type ackedSet struct {
	mu  sync.Mutex
	ids map[string]string
}

func newAckedSet() ackedSet { return ackedSet{ids: map[string]string{}} }

func (s *ackedSet) add(id, label string) {
	s.mu.Lock()
	s.ids[id] = label
	s.mu.Unlock()
}

func (s *ackedSet) get(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

func (s *ackedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *ackedSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.ids))
	for id := range s.ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// recorder keeps the lease history. Each attempt is one operation; one
// without an answer gets, as its return time, the end of the server life
// it was sent in (closeLife): it may have taken effect up to then, never
// later.
type recorder struct {
	mu   sync.Mutex
	ops  []porcupine.Operation
	open []int // operations of the current server life without an answer
}

func (r *recorder) begin(in LeaseInput, at int64, client int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: at})
	return len(r.ops) - 1
}

func (r *recorder) answer(i int, out LeaseOutput, at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out.Answered = true
	r.ops[i].Output, r.ops[i].Return = out, at
}

func (r *recorder) cutOff(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops[i].Output = LeaseOutput{}
	r.open = append(r.open, i)
}

// drop forgets an attempt the server refused before judging it.
func (r *recorder) drop(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops[i].Input = nil
}

// closeLife ends the current server life at `at`: an unanswered call sent
// before then may have been applied up to then; one sent after never was.
func (r *recorder) closeLife(at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range r.open {
		if r.ops[i].Call > at {
			r.ops[i].Input = nil
			continue
		}
		r.ops[i].Return = at
	}
	r.open = r.open[:0]
}

func (r *recorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]porcupine.Operation, 0, len(r.ops))
	for _, op := range r.ops {
		if op.Input == nil {
			continue
		}
		if op.Output == nil {
			panic(fmt.Sprintf("lease operation %v was never answered nor cut off", op.Input))
		}
		out = append(out, op)
	}
	return out
}

func (r *recorder) countByOp() map[string]int {
	out := map[string]int{}
	for _, op := range r.history() {
		out[op.Input.(LeaseInput).Op.String()]++
	}
	return out
}

func (r *recorder) unansweredCount() int {
	n := 0
	for _, op := range r.history() {
		if !op.Output.(LeaseOutput).Answered {
			n++
		}
	}
	return n
}
