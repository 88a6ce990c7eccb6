package rollout

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/tree"
)

// Rollout transcripts replay rollouts from testdata/rollout/*.txt through
// NextRollout, AdvanceRollout and DecideRollout. The selector is always
// version=v1 and the target version=v2. '#' starts a comment line.
//
//	rollout batch=2 max_unavailable=2 deadline=10m baseline=0
//	at 5s candidates=a,b remaining=2 ready=1 b0=marked b1=terminated b0.leases=2 b0.conflicts=1
//	                                 observe these facts at epoch+5s and call NextRollout
//	                                 (bN.leases: open leases; bN.conflicts: conflicted ones;
//	                                 bN.waiting: ones no ready replacement may take;
//	                                 bN.full: ones none that may take them has room for)
//	=> start_batch 1 nodes=a,b       the expected step (batch, nodes=, wake=, reason~text)
//	outcome handed=2 stuck=j1,j2     what the shell reports for the step (default: a
//	                                 start_batch's termination is t<batch>; exited=a,b:
//	                                 the batch's agents that had claimed their exit)
//	decide pause|resume|abort [reason]   an operator's decision at the current time
//	decide! resume                   a decision refused with ErrRolloutFinished
//	state paused batches=done,replacing reason~deadline handed=2
//	                                 the rollout after the pending step is applied
//
// A step is applied when the next directive comes. Every step is checked
// against the invariants in checkRolloutStep.
func TestRolloutTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "rollout", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no rollout transcripts in testdata/rollout")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) { runRolloutTranscript(t, file) })
	}
}

type rolloutTranscript struct {
	t       *testing.T
	where   string
	r       Rollout
	now     time.Time
	facts   RolloutFacts
	pending *RolloutStep
	checked bool
	outcome RolloutOutcome
}

func runRolloutTranscript(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := &rolloutTranscript{t: t, now: t0}
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		tr.where = fmt.Sprintf("%s:%d: %s", filepath.Base(file), line, text)
		fields := strings.Fields(text)
		switch fields[0] {
		case "rollout":
			tr.start(pairs(fields[1:]))
		case "at":
			tr.apply()
			tr.observe(fields[1], fields[2:])
		case "=>":
			tr.expect(fields[1:])
		case "outcome":
			tr.setOutcome(pairs(fields[1:]))
		case "decide", "decide!":
			tr.apply()
			tr.decide(fields[0] == "decide!", fields[1], strings.Join(fields[2:], " "))
		case "state":
			tr.apply()
			tr.state(fields[1], fields[2:])
		default:
			t.Fatalf("%s: unknown directive", tr.where)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	tr.apply()
}

// t0 is the transcripts' epoch.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func pairs(fields []string) map[string]string {
	out := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}
	return out
}

func (tr *rolloutTranscript) fatalf(format string, args ...any) {
	tr.t.Helper()
	tr.t.Fatalf("%s: %s", tr.where, fmt.Sprintf(format, args...))
}

func (tr *rolloutTranscript) num(s string) int {
	tr.t.Helper()
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		tr.fatalf("%q is not a number", s)
	}
	return n
}

func (tr *rolloutTranscript) dur(s string) time.Duration {
	tr.t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		tr.fatalf("%q is not a duration", s)
	}
	return d
}

func (tr *rolloutTranscript) start(args map[string]string) {
	req := RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: tr.num(args["batch"]),
		MaxUnavailable: tr.num(args["max_unavailable"]), RequestedBy: "operator:alice"}
	if d, ok := args["deadline"]; ok {
		req.BatchDeadline = tr.dur(d)
	}
	r, err := NewRollout("o_1", req, tr.num(args["baseline"]), tr.now)
	if err != nil {
		tr.fatalf("%v", err)
	}
	tr.r = r
}

func (tr *rolloutTranscript) observe(at string, fields []string) {
	tr.now = t0.Add(tr.dur(at))
	f := RolloutFacts{Batches: map[int]BatchFacts{}}
	for _, b := range tr.r.Batches {
		if !b.finished() {
			f.Batches[b.Index] = BatchFacts{}
		}
	}
	for k, v := range pairs(fields) {
		switch {
		case k == "candidates":
			if v != "" {
				f.Candidates = strings.Split(v, ",")
			}
		case k == "remaining":
			f.Remaining = tr.num(v)
		case k == "ready":
			f.ReadyTarget = tr.num(v)
		case strings.HasPrefix(k, "b") && strings.HasSuffix(k, ".conflicts"):
			i := tr.num(strings.TrimSuffix(strings.TrimPrefix(k, "b"), ".conflicts"))
			bf := f.Batches[i]
			bf.ConflictedLeases = tr.num(v)
			f.Batches[i] = bf
		case strings.HasPrefix(k, "b") && strings.HasSuffix(k, ".waiting"):
			i := tr.num(strings.TrimSuffix(strings.TrimPrefix(k, "b"), ".waiting"))
			bf := f.Batches[i]
			bf.WaitingLeases = tr.num(v)
			f.Batches[i] = bf
		case strings.HasPrefix(k, "b") && strings.HasSuffix(k, ".full"):
			i := tr.num(strings.TrimSuffix(strings.TrimPrefix(k, "b"), ".full"))
			bf := f.Batches[i]
			bf.FullLeases = tr.num(v)
			f.Batches[i] = bf
		case strings.HasPrefix(k, "b") && strings.HasSuffix(k, ".leases"):
			i := tr.num(strings.TrimSuffix(strings.TrimPrefix(k, "b"), ".leases"))
			bf := f.Batches[i]
			bf.OpenLeases = tr.num(v)
			f.Batches[i] = bf
		case strings.HasPrefix(k, "b"):
			i := tr.num(strings.TrimPrefix(k, "b"))
			bf := f.Batches[i]
			switch v {
			case "marked":
				bf.Marked = true
			case "terminated":
				bf.Marked, bf.Terminated, bf.RecordID = true, true, fmt.Sprintf("r%d", i)
			default:
				tr.fatalf("b%d=%s: want marked or terminated", i, v)
			}
			f.Batches[i] = bf
		default:
			tr.fatalf("unknown fact %s", k)
		}
	}
	tr.facts = f
	step := NextRollout(tr.r, f, tr.now)
	tr.pending, tr.checked, tr.outcome = &step, false, RolloutOutcome{}
	if step.Action == ActRolloutStartBatch {
		tr.outcome.TerminationID = fmt.Sprintf("t%d", step.Batch)
	}
	checkRolloutStep(tr, step)
}

// checkRolloutStep holds for every decision, whatever the transcript says.
func checkRolloutStep(tr *rolloutTranscript, step RolloutStep) {
	tr.t.Helper()
	r, f := tr.r, tr.facts
	if step.Action != ActRolloutStartBatch {
		return
	}
	if r.State != RolloutRunning {
		tr.fatalf("invariant: a batch starts while the rollout is %s", r.State)
	}
	for _, b := range r.Batches {
		if !b.finished() && b.TerminatedAt.IsZero() {
			tr.fatalf("invariant: batch %d starts while batch %d's termination runs", step.Batch, b.Index)
		}
	}
	if got := r.Unavailable(f.ReadyTarget) + len(step.Nodes); got > r.MaxUnavailable {
		tr.fatalf("invariant: starting batch %d makes %d unavailable, more than %d", step.Batch, got, r.MaxUnavailable)
	}
	if len(step.Nodes) > r.Batch {
		tr.fatalf("invariant: batch of %d, more than %d", len(step.Nodes), r.Batch)
	}
}

func (tr *rolloutTranscript) expect(fields []string) {
	if tr.pending == nil {
		tr.fatalf("=> without an observation")
	}
	got := *tr.pending
	tr.checked = true
	if got.Action.String() != fields[0] {
		tr.fatalf("step %s (batch %d, reason %q), want %s", got.Action, got.Batch, got.Reason, fields[0])
	}
	for _, f := range fields[1:] {
		k, v, hasValue := strings.Cut(f, "=")
		switch {
		case !hasValue && !strings.Contains(f, "~"):
			if n := tr.num(f); got.Batch != n {
				tr.fatalf("batch %d, want %d", got.Batch, n)
			}
		case k == "nodes":
			if strings.Join(got.Nodes, ",") != v {
				tr.fatalf("nodes %v, want %s", got.Nodes, v)
			}
		case k == "wake":
			want := time.Time{}
			if v != "-" {
				want = t0.Add(tr.dur(v))
			}
			if !got.Wake.Equal(want) {
				tr.fatalf("wake %s, want %s", got.Wake.Sub(t0), v)
			}
		case strings.HasPrefix(f, "reason~"):
			text := strings.ReplaceAll(strings.TrimPrefix(f, "reason~"), "_", " ")
			if !strings.Contains(got.Reason, text) {
				tr.fatalf("reason %q does not contain %q", got.Reason, text)
			}
		default:
			tr.fatalf("unknown expectation %s", f)
		}
	}
}

func (tr *rolloutTranscript) setOutcome(args map[string]string) {
	if v, ok := args["handed"]; ok {
		tr.outcome.HandedOver = tr.num(v)
	}
	if v := args["stuck"]; v != "" {
		tr.outcome.NotHandedOver = strings.Split(v, ",")
	}
	if v := args["exited"]; v != "" {
		tr.outcome.Exited = strings.Split(v, ",")
	}
}

func (tr *rolloutTranscript) apply() {
	tr.t.Helper()
	if tr.pending == nil {
		return
	}
	if !tr.checked {
		tr.fatalf("the step %s before this line was not checked with =>", tr.pending.Action)
	}
	next, err := AdvanceRollout(tr.r, *tr.pending, tr.outcome, tr.facts, tr.now)
	if err != nil {
		tr.fatalf("AdvanceRollout(%s): %v", tr.pending.Action, err)
	}
	tr.r, tr.pending = next, nil
}

func (tr *rolloutTranscript) decide(refused bool, what, reason string) {
	d := map[string]RolloutDecision{"pause": DecidePause, "resume": DecideResume, "abort": DecideAbort}[what]
	if d == 0 {
		tr.fatalf("unknown decision %s", what)
	}
	next, _, err := DecideRollout(tr.r, d, reason, "operator:bob", tr.now)
	switch {
	case refused && !errors.Is(err, ErrRolloutFinished):
		tr.fatalf("decision %s: %v, want ErrRolloutFinished", what, err)
	case !refused && err != nil:
		tr.fatalf("decision %s: %v", what, err)
	case refused && (next.State != tr.r.State || !next.UpdatedAt.Equal(tr.r.UpdatedAt)):
		tr.fatalf("a refused decision changed the rollout")
	}
	tr.r = next
}

func (tr *rolloutTranscript) state(want string, fields []string) {
	if got := tr.r.State.String(); got != want {
		tr.fatalf("state %s (reason %q), want %s", got, tr.r.Reason, want)
	}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		switch {
		case k == "batches":
			var states []string
			for _, b := range tr.r.Batches {
				states = append(states, b.State().String())
			}
			if strings.Join(states, ",") != v {
				tr.fatalf("batches %v, want %s", states, v)
			}
		case k == "handed":
			if got := tr.r.LeasesHandedOver(); got != tr.num(v) {
				tr.fatalf("leases handed over %d, want %s", got, v)
			}
		case k == "stuck":
			var stuck []string
			for _, b := range tr.r.Batches {
				stuck = append(stuck, b.LeasesNotHandedOver...)
			}
			if strings.Join(stuck, ",") != v {
				tr.fatalf("leases not handed over %v, want %s", stuck, v)
			}
		case k == "release_pending":
			if fmt.Sprint(tr.r.ReleasePending) != v {
				tr.fatalf("release_pending %v, want %s", tr.r.ReleasePending, v)
			}
		case k == "records":
			var recs []string
			for _, b := range tr.r.Batches {
				recs = append(recs, b.RecordID)
			}
			if strings.Join(recs, ",") != v {
				tr.fatalf("records %v, want %s", recs, v)
			}
		case strings.HasPrefix(f, "reason~"):
			text := strings.ReplaceAll(strings.TrimPrefix(f, "reason~"), "_", " ")
			if !strings.Contains(tr.r.Reason, text) {
				tr.fatalf("reason %q does not contain %q", tr.r.Reason, text)
			}
		default:
			tr.fatalf("unknown state check %s", f)
		}
	}
}

func TestNewRolloutRefusesWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  RolloutRequest
		want string
	}{
		{"no selector", RolloutRequest{TargetSelector: "version=v2"}, "selector is required"},
		{"no target", RolloutRequest{Selector: "version=v1"}, "target_selector is required"},
		{"target inside selector", RolloutRequest{Selector: "app=x", TargetSelector: "app=x,version=v2"}, "would be replaced in turn"},
		{"same selectors", RolloutRequest{Selector: "version=v1", TargetSelector: "version=v1"}, "would be replaced in turn"},
		{"max unavailable below batch", RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 5, MaxUnavailable: 2}, "at least batch"},
		{"deadline shorter than a termination", RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", BatchDeadline: time.Minute, DrainWindow: time.Minute}, "too short"},
		{"malformed selector", RolloutRequest{Selector: "version", TargetSelector: "version=v2"}, "not k=v"},
		{"batch too large", RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: MaxRolloutBatch + 1}, "batch must be"},
	} {
		_, err := NewRollout("o_1", tc.req, 0, t0)
		if !errors.Is(err, tree.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want invalid argument containing %q", tc.name, err, tc.want)
		}
	}
	r, err := NewRollout("o_1", RolloutRequest{Selector: "version=v1,app=x", TargetSelector: "version=v2"}, 3, t0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Batch != 1 || r.MaxUnavailable != 1 || r.BatchDeadline != DefaultBatchDeadline || r.Selector != "app=x,version=v1" || r.BaselineReady != 3 {
		t.Fatalf("defaults: %+v", r)
	}
}

// TestAdvanceRolloutRefusesStepsThatDoNotFit: the one transition function
// refuses edges the machine would never take.
func TestAdvanceRolloutRefusesStepsThatDoNotFit(t *testing.T) {
	r, err := NewRollout("o_1", RolloutRequest{Selector: "version=v1", TargetSelector: "version=v2", Batch: 2}, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	f := RolloutFacts{}
	for _, step := range []RolloutStep{
		{Action: ActRolloutNoteTerminated, Batch: 0},
		{Action: ActRolloutHandOver, Batch: 0},
		{Action: ActRolloutStartBatch, Batch: 1, Nodes: []string{"a"}},
		{Action: ActRolloutRelease},
	} {
		if _, err := AdvanceRollout(r, step, RolloutOutcome{TerminationID: "t"}, f, t0); err == nil {
			t.Errorf("%s accepted on a fresh rollout", step.Action)
		}
	}
	r, err = AdvanceRollout(r, RolloutStep{Action: ActRolloutStartBatch, Batch: 0, Nodes: []string{"a", "b"}}, RolloutOutcome{TerminationID: "t0"}, f, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AdvanceRollout(r, RolloutStep{Action: ActRolloutStartBatch, Batch: 1, Nodes: []string{"c"}}, RolloutOutcome{TerminationID: "t1", Exited: []string{"d"}}, f, t0); err == nil {
		t.Error("a batch started listing as exited an agent it does not drain")
	}
	if _, err := AdvanceRollout(r, RolloutStep{Action: ActRolloutCompleteBatch, Batch: 0}, RolloutOutcome{}, f, t0); err == nil {
		t.Error("a batch completed before it was terminated and replaced")
	}
	if _, err := AdvanceRollout(r, RolloutStep{Action: ActRolloutComplete}, RolloutOutcome{}, f, t0); err == nil {
		t.Error("a rollout completed with an unfinished batch")
	}
	paused, _, err := DecideRollout(r, DecidePause, "", "operator:bob", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AdvanceRollout(paused, RolloutStep{Action: ActRolloutStartBatch, Batch: 1, Nodes: []string{"c"}}, RolloutOutcome{TerminationID: "t1"}, f, t0); err == nil {
		t.Error("a batch started while paused")
	}
}
