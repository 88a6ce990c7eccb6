package lease_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue25AReasonNamesItsSenderWhereNoWordsCanForgeIt: a worker
// message's reason names its sender as ` from "<holder>"`, and the RPC
// layer reads who sent a row from there (controlplane treeRows: a row is
// another tree's when its sender is). Whatever a sender puts in the lease
// id it claims, a progress value or a result's detail — quotes, the words
// ` from "`, another agent's id — the reason names no other sender, in any
// state the message is judged in (notes the clock forced included).
func TestRogue25AReasonNamesItsSenderWhereNoWordsCanForgeIt(t *testing.T) {
	p := lease.DefaultPolicy()
	const other = "n_other"
	words := []string{
		`x" from "` + other + `"`, `x from `, `" from "` + other, other, `from "` + other + `" seq 1`, "\" from \"" + other + "\"\n",
	}
	active := activeLease(t, p)
	expired, _, _ := lease.Step(active, lease.Tick{JobID: "j1"}, active.ExpiresAt, p)
	for _, w := range words {
		claim := lease.Claim{JobID: "j1", LeaseID: w, Generation: 1, HolderIdentity: "w1"}
		own := claimW1()
		msgs := []lease.Message{
			lease.Ack{Claim: claim}, lease.Renew{Claim: claim, RenewSequence: 1}, lease.CancelAck{Claim: claim},
			lease.Progress{Claim: own, ProgressSequence: 1, ProgressValue: w},
			lease.Progress{Claim: claim, ProgressSequence: 1, ProgressValue: w},
			lease.Complete{Claim: own, Result: lease.ResultFailed, Detail: w},
		}
		for _, l := range []lease.Lease{active, expired} {
			for _, m := range msgs {
				for _, now := range []time.Time{active.ExpiresAt.Add(-time.Second), active.ExpiresAt} {
					_, d, _ := lease.Step(l, m, now, p)
					if !strings.Contains(d.Reason, ` from "w1"`) || strings.Contains(d.Reason, " from "+strconv.Quote(other)) {
						t.Errorf("%s with %q on a %s lease: the reason does not name w1 alone as its sender: %q", m.Kind(), w, l.State, d.Reason)
					}
				}
			}
		}
	}
}

// TestRogue25AFormerHoldersViewIsTheSameWhateverItGuesses: what a former
// holder reads of its judged message (lease.ForFormerHolder) names the
// job, its generation and state, never the current lease id, holder or
// deadlines, and reads the same whether what it sent is the current
// holder's or lease id or not.
func TestRogue25AFormerHoldersViewIsTheSameWhateverItGuesses(t *testing.T) {
	p := lease.DefaultPolicy()
	l := activeLease(t, p)
	l, d, _ := lease.Step(l, lease.Reassign{JobID: "j1", LeaseID: "L2", HolderIdentity: "w2", LeaseDuration: time.Minute, Reason: "move"}, at(5), p)
	if d.Outcome != lease.OutcomeAccepted {
		t.Fatalf("reassign: %s", d)
	}
	l, _, _ = lease.Step(l, lease.Ack{Claim: lease.Claim{JobID: "j1", LeaseID: "L2", Generation: 2, HolderIdentity: "w2"}}, at(6), p)
	view := func(guess string, now time.Time) string {
		m := lease.Progress{Claim: lease.Claim{JobID: "j1", LeaseID: guess, Generation: 1, HolderIdentity: "w1"}, ProgressSequence: 9, ProgressValue: guess}
		after, d, _ := lease.Step(l, m, now, p)
		if d.Event != lease.EventStaleGeneration {
			t.Fatalf("a former holder's progress: %s", d)
		}
		seen, sd := lease.ForFormerHolder(after, m, d)
		if seen != (lease.Lease{JobID: "j1", Generation: 2, State: after.State}) || sd.Outcome != d.Outcome || sd.Event != d.Event || sd.Err() == nil {
			t.Fatalf("the former holder's view: %+v %s", seen, sd)
		}
		return strings.ReplaceAll(sd.Reason, strconv.Quote(guess), "<guess>")
	}
	for _, now := range []time.Time{at(10), l.ExpiresAt} {
		right, wrong := view("w2", now), view("w9", now)
		if right != wrong || view("L2", now) != view("L9", now) {
			t.Errorf("at %s the former holder tells a right guess from a wrong one:\n%s\n%s", now, right, wrong)
		}
		for _, secret := range []string{`"L2"`, `"w2"`, l.ExpiresAt.UTC().Format(time.RFC3339Nano)} {
			if strings.Contains(view("w9", now), secret) {
				t.Errorf("at %s the former holder's view shows %s: %s", now, secret, view("w9", now))
			}
		}
	}
}
