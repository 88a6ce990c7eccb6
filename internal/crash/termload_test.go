package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

const termClients = 2

// termLoad terminates small subtrees (a root and two children) with a
// tool call in flight through the harness's tool gate, in drain or abort
// mode, with short windows on the server's real clock, and sometimes
// confirms a child's exit as a launcher would.
type termLoad struct {
	h     *harness
	mu    sync.Mutex
	acked map[string]ackedTermination
	n     int
	// calls are the tool calls in flight; they end when the gate gets
	// their cancel order, or when the test ends.
	calls sync.WaitGroup
	// done: terminations already seen terminated with their one record.
	done map[string]bool
}

type ackedTermination struct {
	id      string
	root    string
	members []string
	round   int
}

func newTermLoad(h *harness) *termLoad {
	return &termLoad{h: h, acked: map[string]ackedTermination{}, done: map[string]bool{}}
}

func (l *termLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

func (l *termLoad) run(wg *sync.WaitGroup, stop <-chan struct{}, seed uint64) {
	for i := range termClients {
		wg.Add(1)
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		go func() {
			defer wg.Done()
			for !stopped(stop) {
				before := l.h.unanswered.Load()
				l.terminate(rng, stop)
				if l.h.unanswered.Load() > before {
					backoff(stop) // the server is probably gone: do not spin
				}
			}
		}()
	}
}

func (l *termLoad) terminate(rng *rand.Rand, stop <-chan struct{}) {
	h := l.h
	l.mu.Lock()
	l.n++
	n := l.n
	round := h.round
	l.mu.Unlock()
	root, ok := h.register(fmt.Sprintf("term-root-%d", n))
	if !ok {
		return
	}
	a, ok := h.spawn(root, "term-a")
	if !ok {
		return
	}
	b, ok := h.spawn(root, "term-b")
	if !ok {
		return
	}
	var token string
	if ok, _ := h.write("issue root", func(ctx context.Context) error {
		r, err := h.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: a.id, Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		if err == nil {
			token = r.Msg.Token
		}
		return err
	}); !ok {
		return
	}
	// A tool call in flight: its handler runs until the gate gets the
	// call's cancel order (abort, or a drain outlasting its window).
	started := make(chan struct{})
	ended := make(chan struct{})
	l.calls.Add(1)
	go func() {
		defer l.calls.Done()
		defer close(ended)
		_ = h.gate.Call(h.bg, token, "shell", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	select {
	case <-started:
	case <-ended: // refused or cut off: terminate anyway
	case <-stop:
		return
	}
	mode := tetherv1.TerminationMode_TERMINATION_MODE_ABORT
	if rng.IntN(2) == 0 {
		mode = tetherv1.TerminationMode_TERMINATION_MODE_DRAIN
	}
	var term *tetherv1.Termination
	if ok, _ := h.write("terminate", func(ctx context.Context) error {
		r, err := h.admin.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
			NodeId: root.id, Mode: mode, Reason: "crash harness",
			DrainWindow: durationpb.New(200 * time.Millisecond), CancelAckTimeout: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second),
		}))
		if err == nil {
			term = r.Msg.Termination
		}
		return err
	}); !ok {
		return
	}
	l.mu.Lock()
	l.acked[term.TerminationId] = ackedTermination{id: term.TerminationId, root: root.id, members: []string{root.id, a.id, b.id}, round: round}
	l.mu.Unlock()
	if rng.IntN(2) == 0 {
		// A launcher confirms b's exit; refused once b is terminated.
		_, _ = h.call(func(ctx context.Context) error {
			_, err := h.admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: b.id}))
			return err
		})
	}
}

// check: every acknowledged termination exists; each from an earlier
// server life (or all of them, when final) reaches terminated after the
// restart, with exactly one record listing each of its nodes once,
// delivered to the record directory; no termination has two records.
func (l *termLoad) check(round int, final bool) {
	h := l.h
	h.t.Helper()
	ctx := context.Background()
	l.mu.Lock()
	var pending []ackedTermination
	for _, term := range l.acked {
		if !l.done[term.id] && (final || term.round < round) {
			pending = append(pending, term)
		}
	}
	all := make([]ackedTermination, 0, len(l.acked))
	for _, term := range l.acked {
		all = append(all, term)
	}
	l.mu.Unlock()
	for _, term := range all {
		if _, err := h.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.id})); err != nil {
			h.t.Errorf("round %d: acknowledged termination %s: %v", round, term.id, err)
		}
	}
	for _, term := range pending {
		testserver.WaitFor(h.t, time.Minute, fmt.Sprintf("round %d: termination %s to reach terminated after the restart", round, term.id), func() bool {
			resp, err := h.admin.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.id}))
			return err == nil && resp.Msg.Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
		})
	}
	records := map[string][]*tetherv1.ReconciliationRecord{}
	page := ""
	for {
		resp, err := h.admin.Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{PageToken: page}))
		if err != nil {
			h.t.Fatalf("round %d: list records: %v", round, err)
		}
		for _, r := range resp.Msg.Records {
			records[r.TerminationId] = append(records[r.TerminationId], r)
		}
		if page = resp.Msg.NextPageToken; page == "" {
			break
		}
	}
	for id, recs := range records {
		if len(recs) > 1 {
			h.t.Errorf("round %d: termination %s has %d records", round, id, len(recs))
		}
	}
	for _, term := range pending {
		recs := records[term.id]
		if len(recs) != 1 {
			h.t.Errorf("round %d: terminated termination %s has %d records, want exactly one", round, term.id, len(recs))
			continue
		}
		rec := recs[0]
		seen := map[string]int{}
		for _, n := range rec.Nodes {
			seen[n.NodeId]++
		}
		for _, m := range term.members {
			if seen[m] != 1 {
				h.t.Errorf("round %d: record %s lists node %s %d times, want once", round, rec.RecordId, m, seen[m])
			}
		}
		path := filepath.Join(h.dir, "records", rec.RecordId+".json")
		testserver.WaitFor(h.t, time.Minute, "record "+rec.RecordId+" delivered to "+path, func() bool {
			_, err := os.Stat(path)
			return err == nil
		})
		h.checkedRecords++
		l.mu.Lock()
		l.done[term.id] = true
		l.mu.Unlock()
	}
}
