package crash

import (
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/types/known/durationpb"
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

// history builds operations for the model tests: each op is [call, ret].
type history []porcupine.Operation

func (h *history) add(call, ret int64, in LeaseInput, out LeaseOutput) {
	*h = append(*h, porcupine.Operation{ClientId: len(*h), Input: in, Output: out, Call: call, Return: ret})
}

func answered(o tetherv1.Outcome, v LeaseView) LeaseOutput {
	return LeaseOutput{Answered: true, Outcome: o, Lease: v}
}

func view(gen uint64, leaseID, holder string, state tetherv1.LeaseState, renew uint64) LeaseView {
	return LeaseView{Exists: true, Generation: gen, LeaseID: leaseID, Holder: holder, State: state, RenewSequence: renew}
}

func TestLeaseModelAcceptsASequentialHistory(t *testing.T) {
	var h history
	h.add(0, 1, LeaseInput{Op: OpOffer, Job: "j", Holder: "w1"}, answered(accepted, view(1, "L1", "w1", offered, 0)))
	h.add(2, 3, LeaseInput{Op: OpAck, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1}, answered(accepted, view(1, "L1", "w1", active, 0)))
	h.add(4, 5, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 1}, answered(accepted, view(1, "L1", "w1", active, 1)))
	h.add(6, 7, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 1}, answered(duplicate, view(1, "L1", "w1", active, 1)))
	h.add(8, 9, LeaseInput{Op: OpReassign, Job: "j", Holder: "w2"}, answered(accepted, view(2, "L2", "w2", offered, 0)))
	h.add(10, 11, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 2}, answered(rejected, view(2, "L2", "w2", offered, 0)))
	// A former holder's answer withholds the successor's lease: the
	// generation and its state only.
	h.add(10, 11, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 3}, answered(rejected, LeaseView{Exists: true, Generation: 2, State: offered}))
	h.add(12, 13, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(2, "L2", "w2", offered, 0)))
	h.add(0, 1, LeaseInput{Op: OpGet, Job: "other"}, answered(0, LeaseView{}))
	if res := porcupine.CheckOperations(LeaseModel(), h); !res {
		t.Fatal("a sequential history the protocol allows was judged not linearizable")
	}
}

// The model must catch what the harness exists to catch: a lost
// acknowledged write, a revived generation, an accepted sequence accepted
// twice, and a read that goes back in time.
func TestLeaseModelRejectsViolations(t *testing.T) {
	start := func() history {
		var h history
		h.add(0, 1, LeaseInput{Op: OpOffer, Job: "j", Holder: "w1"}, answered(accepted, view(1, "L1", "w1", offered, 0)))
		h.add(2, 3, LeaseInput{Op: OpAck, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1}, answered(accepted, view(1, "L1", "w1", active, 0)))
		h.add(4, 5, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 3}, answered(accepted, view(1, "L1", "w1", active, 3)))
		return h
	}
	renew := func(seq uint64) LeaseInput {
		return LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: seq}
	}
	for name, tail := range map[string]func(h *history){
		"an acknowledged renew lost across a restart": func(h *history) {
			h.add(10, 11, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(1, "L1", "w1", active, 0)))
		},
		"an expired generation revived": func(h *history) {
			h.add(10, 11, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(1, "L1", "w1", expired, 3)))
			h.add(12, 13, renew(4), answered(accepted, view(1, "L1", "w1", active, 4)))
		},
		"the same sequence accepted twice": func(h *history) {
			h.add(10, 11, renew(3), answered(accepted, view(1, "L1", "w1", active, 3)))
		},
		"a lower sequence accepted": func(h *history) {
			h.add(10, 11, renew(2), answered(accepted, view(1, "L1", "w1", active, 2)))
		},
		"success after a cancel request": func(h *history) {
			h.add(10, 11, LeaseInput{Op: OpRequestCancel, Job: "j"}, answered(accepted, LeaseView{Exists: true, Generation: 1, LeaseID: "L1", Holder: "w1", State: active, RenewSequence: 3, CancelRequested: true}))
			h.add(12, 13, LeaseInput{Op: OpComplete, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Result: success},
				answered(accepted, LeaseView{Exists: true, Generation: 1, LeaseID: "L1", Holder: "w1", State: terminal, RenewSequence: 3, CancelRequested: true, Result: success}))
		},
		"a stale generation accepted after a reassignment": func(h *history) {
			h.add(10, 11, LeaseInput{Op: OpReassign, Job: "j", Holder: "w2"}, answered(accepted, view(2, "L2", "w2", offered, 0)))
			h.add(12, 13, renew(4), answered(accepted, view(1, "L1", "w1", active, 4)))
		},
		"a former holder's withheld answer naming a generation never issued": func(h *history) {
			h.add(10, 11, LeaseInput{Op: OpReassign, Job: "j", Holder: "w2"}, answered(accepted, view(2, "L2", "w2", offered, 0)))
			h.add(12, 13, renew(4), answered(rejected, LeaseView{Exists: true, Generation: 3, State: offered}))
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := start()
			tail(&h)
			if porcupine.CheckOperations(LeaseModel(), h) {
				t.Fatal("judged linearizable")
			}
		})
	}
}

// A call the kill cut off may have been applied or not; either is
// linearizable, and concurrent calls may take effect in either order.
func TestLeaseModelUnansweredAndConcurrentCalls(t *testing.T) {
	base := func() history {
		var h history
		h.add(0, 1, LeaseInput{Op: OpOffer, Job: "j", Holder: "w1"}, LeaseOutput{}) // no answer
		h.add(2, 3, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(1, "L9", "w1", offered, 0)))
		h.add(4, 5, LeaseInput{Op: OpAck, Job: "j", Holder: "w1", LeaseID: "L9", Generation: 1}, answered(accepted, view(1, "L9", "w1", active, 0)))
		h.add(6, 7, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L9", Generation: 1, Sequence: 1}, LeaseOutput{}) // cut off
		return h
	}
	applied := base()
	applied.add(8, 9, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(1, "L9", "w1", active, 1)))
	notApplied := base()
	notApplied.add(8, 9, LeaseInput{Op: OpGet, Job: "j"}, answered(0, view(1, "L9", "w1", active, 0)))
	for name, h := range map[string]history{"applied": applied, "not applied": notApplied} {
		if !porcupine.CheckOperations(LeaseModel(), h) {
			t.Errorf("an unanswered renew %s: judged not linearizable", name)
		}
	}
	// A renew and a reassignment overlap: the renew was judged first.
	var h history
	h.add(0, 1, LeaseInput{Op: OpOffer, Job: "j", Holder: "w1"}, answered(accepted, view(1, "L1", "w1", offered, 0)))
	h.add(2, 3, LeaseInput{Op: OpAck, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1}, answered(accepted, view(1, "L1", "w1", active, 0)))
	h.add(4, 8, LeaseInput{Op: OpReassign, Job: "j", Holder: "w2"}, answered(accepted, view(2, "L2", "w2", offered, 0)))
	h.add(5, 9, LeaseInput{Op: OpRenew, Job: "j", Holder: "w1", LeaseID: "L1", Generation: 1, Sequence: 1}, answered(accepted, view(1, "L1", "w1", active, 1)))
	if !porcupine.CheckOperations(LeaseModel(), h) {
		t.Error("overlapping renew and reassign: judged not linearizable")
	}
}

// TestLeaseModelAgreesWithStep checks the model against the real state
// machine (lease.Step, through the converters the server uses) on random
// message sequences, so that a crash-test failure means the server, not
// the model, is wrong.
func TestLeaseModelAgreesWithStep(t *testing.T) {
	p := lease.DefaultPolicy()
	epoch := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		var (
			l     lease.Lease
			model LeaseView
			ids   int
		)
		holders := []string{"w1", "w2"}
		results := []tetherv1.TerminalResult{success, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, cancelled}
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for i := range steps {
			now := epoch.Add(time.Duration(i) * time.Second)
			in := LeaseInput{Op: LeaseOp(rapid.IntRange(int(OpOffer), int(OpResolve)).Draw(t, "op")), Job: "j",
				Holder: rapid.SampledFrom(holders).Draw(t, "holder")}
			if l.Exists() && in.Op != OpReassign && rapid.IntRange(0, 3).Draw(t, "otherHolder") > 0 {
				in.Holder = l.HolderIdentity // mostly the holder speaks
			}
			// Claims mostly name the current generation, sometimes an
			// older or a future one, or another lease id.
			in.LeaseID, in.Generation = l.LeaseID, max(l.Generation, 1)
			switch rapid.IntRange(0, 9).Draw(t, "claim") {
			case 0:
				in.Generation--
			case 1:
				in.Generation++
			case 2:
				in.LeaseID = "Lx"
			}
			in.Sequence = uint64(rapid.IntRange(0, 4).Draw(t, "seq"))
			if in.Op == OpProgress {
				in.Sequence = l.ProgressSequence + uint64(rapid.IntRange(0, 2).Draw(t, "progressStep")) - 1
			} else if in.Op == OpRenew {
				in.Sequence = l.RenewSequence + uint64(rapid.IntRange(0, 2).Draw(t, "renewStep")) - 1
			}
			in.Value = rapid.SampledFrom([]string{"a", "b"}).Draw(t, "value")
			in.Result = rapid.SampledFrom(results).Draw(t, "result")
			if in.Op == OpResolve && in.Result == success {
				in.Result = tetherv1.TerminalResult_TERMINAL_RESULT_FAILED
			}
			ids++
			newID := fmt.Sprintf("L%d", ids)
			m, err := toMessage(in, newID, l, p)
			if err != nil {
				continue // malformed for the server too: never judged
			}
			next, d, _ := lease.Step(l, m, now, p)
			got := wire.Lease(next)
			states := StepLease(model, in, LeaseOutput{Answered: true, Outcome: wire.Decision(d).Outcome, Lease: ViewOf(got)})
			if len(states) != 1 {
				t.Fatalf("step %d %s: Step says %s (%s) leaving %s; the model disagrees from %s", i, in.Op, d.Outcome, d.Reason, ViewOf(got), model)
			}
			l, model = next, states[0].(LeaseView)
		}
	})
}

// toMessage converts a model input into the message the server would judge.
func toMessage(in LeaseInput, newLeaseID string, current lease.Lease, p lease.Policy) (lease.Message, error) {
	long := durationpb.New(10 * time.Minute)
	switch in.Op {
	case OpOffer:
		return wire.OfferMessage(&tetherv1.OfferRequest{JobId: in.Job, HolderIdentity: in.Holder, LeaseDuration: long}, newLeaseID, p)
	case OpReassign:
		return wire.ReassignMessage(&tetherv1.ReassignRequest{JobId: in.Job, HolderIdentity: in.Holder, LeaseDuration: long}, newLeaseID, current, p)
	case OpRequestCancel:
		return wire.RequestCancelMessage(&tetherv1.RequestCancelRequest{JobId: in.Job, Reason: "test"})
	case OpResolve:
		return wire.ResolveMessage(&tetherv1.ResolveRequest{JobId: in.Job, Result: in.Result, Reason: "test"}, p)
	case OpAck:
		return wire.AckMessage(&tetherv1.AckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation}, in.Holder)
	case OpRenew:
		return wire.RenewMessage(&tetherv1.RenewRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, RenewSequence: in.Sequence}, in.Holder)
	case OpProgress:
		return wire.ProgressMessage(&tetherv1.ProgressRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, ProgressSequence: in.Sequence, ProgressValue: in.Value}, in.Holder)
	case OpCancelAck:
		return wire.CancelAckMessage(&tetherv1.LeaseServiceCancelAckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation}, in.Holder)
	case OpComplete:
		return wire.CompleteMessage(&tetherv1.CompleteRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, Result: in.Result}, in.Holder)
	}
	return nil, fmt.Errorf("no message for %s", in.Op)
}
