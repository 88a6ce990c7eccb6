package lease_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/supervisor/lease"
)

func at(seconds int) time.Time { return epoch.Add(time.Duration(seconds) * time.Second) }

func TestDeadlineQueuePopDueInOrder(t *testing.T) {
	var q lease.DeadlineQueue
	q.Push("c", at(30))
	q.Push("a", at(10))
	q.Push("b", at(10))
	q.Push("d", at(40))
	if q.Len() != 4 {
		t.Fatalf("Len = %d, want 4", q.Len())
	}
	if d, ok := q.Peek(); !ok || d.JobID != "a" {
		t.Fatalf("Peek = %v %v, want a", d, ok)
	}
	if due := q.PopDue(at(9)); len(due) != 0 {
		t.Fatalf("PopDue before any deadline = %v", due)
	}
	due := q.PopDue(at(30))
	want := []lease.Deadline{{JobID: "a", At: at(10)}, {JobID: "b", At: at(10)}, {JobID: "c", At: at(30)}}
	if fmt.Sprint(due) != fmt.Sprint(want) {
		t.Fatalf("PopDue = %v, want %v", due, want)
	}
	if q.Len() != 1 {
		t.Fatalf("Len after PopDue = %d, want 1", q.Len())
	}
}

func TestDeadlineQueueUpdateAndRemove(t *testing.T) {
	var q lease.DeadlineQueue
	if q.Update("a", at(1)) {
		t.Fatal("Update of an absent job reported true")
	}
	if q.Remove("a") {
		t.Fatal("Remove of an absent job reported true")
	}
	q.Push("a", at(10))
	q.Push("b", at(20))
	q.Push("a", at(30)) // Push of a queued job moves it
	if q.Len() != 2 {
		t.Fatalf("Len = %d, want 2 (Push must not duplicate)", q.Len())
	}
	if !q.Update("b", at(40)) {
		t.Fatal("Update of a queued job reported false")
	}
	if due := q.PopDue(at(35)); len(due) != 1 || due[0].JobID != "a" {
		t.Fatalf("PopDue = %v, want only a", due)
	}
	if !q.Remove("b") || q.Len() != 0 {
		t.Fatalf("Remove(b) left %d", q.Len())
	}
	if _, ok := q.Peek(); ok {
		t.Fatal("Peek on an empty queue reported a deadline")
	}
}

func TestDeadlineQueueSync(t *testing.T) {
	var q lease.DeadlineQueue
	p := lease.DefaultPolicy()
	l, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 30 * time.Second}, at(0), p)
	q.Sync(l)
	if d, _ := q.Peek(); !d.At.Equal(l.AckDeadline) {
		t.Fatalf("offered lease queued at %v, want ACK deadline %v", d.At, l.AckDeadline)
	}
	l, _, _ = lease.Step(l, lease.Ack{Claim: claimW1()}, at(1), p)
	q.Sync(l)
	if d, _ := q.Peek(); !d.At.Equal(at(31)) || q.Len() != 1 {
		t.Fatalf("active lease queued at %v (len %d), want expiry %v", d.At, q.Len(), at(31))
	}
	due := q.PopDue(at(31))
	if len(due) != 1 {
		t.Fatalf("PopDue = %v", due)
	}
	l, d, _ := lease.Step(l, lease.Tick{JobID: due[0].JobID}, at(31), p)
	if d.Event != lease.EventLeaseExpired {
		t.Fatalf("tick: %s", d)
	}
	q.Sync(l)
	if q.Len() != 0 {
		t.Fatal("expired lease still queued")
	}
}

// TestDeadlineQueueAgainstMap checks the heap against a plain map under
// random operations.
func TestDeadlineQueueAgainstMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q lease.DeadlineQueue
		ref := map[string]time.Time{}
		jobs := []string{"a", "b", "c", "d", "e", "f"}
		for i := rapid.IntRange(1, 80).Draw(t, "ops"); i > 0; i-- {
			job := rapid.SampledFrom(jobs).Draw(t, "job")
			when := at(rapid.IntRange(0, 20).Draw(t, "at"))
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				q.Push(job, when)
				ref[job] = when
			case 1:
				_, queued := ref[job]
				if q.Update(job, when) != queued {
					t.Fatalf("Update(%s) disagreed with the map", job)
				}
				if queued {
					ref[job] = when
				}
			case 2:
				_, queued := ref[job]
				if q.Remove(job) != queued {
					t.Fatalf("Remove(%s) disagreed with the map", job)
				}
				delete(ref, job)
			case 3:
				now := at(rapid.IntRange(0, 20).Draw(t, "now"))
				var want []lease.Deadline
				for j, w := range ref {
					if !w.After(now) {
						want = append(want, lease.Deadline{JobID: j, At: w})
						delete(ref, j)
					}
				}
				sort.Slice(want, func(i, k int) bool {
					if !want[i].At.Equal(want[k].At) {
						return want[i].At.Before(want[k].At)
					}
					return want[i].JobID < want[k].JobID
				})
				if got := q.PopDue(now); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("PopDue(%v) = %v, want %v", now, got, want)
				}
			}
			if q.Len() != len(ref) {
				t.Fatalf("Len = %d, map has %d", q.Len(), len(ref))
			}
		}
	})
}

func TestPlanRestartSpreadsPileUp(t *testing.T) {
	p := lease.DefaultPolicy()
	p.RestartGrace = 30 * time.Second
	p.RestartSpread = 10 * time.Second
	lastAlive, restartAt := at(100), at(200)
	active := func(job string, expires int) lease.Lease {
		return lease.Lease{JobID: job, LeaseID: "L-" + job, Generation: 1, HolderIdentity: "w1", State: lease.StateActive,
			AckState: lease.AckAcked, LeaseDuration: 30 * time.Second, ExpiresAt: at(expires)}
	}
	leases := []lease.Lease{
		active("before-stop", 90), // expired while the coordinator was up: not extended
		active("at-stop", 100),    // expired at the instant it was last alive: not extended either
		active("b", 150),
		active("a", 150),
		active("c", 120),
		active("d", 229),    // still inside the grace window: extended
		active("late", 230), // already beyond the grace floor: untouched
		{JobID: "offered", LeaseID: "L-o", Generation: 1, HolderIdentity: "w2", State: lease.StateOffered, AckState: lease.AckPending,
			LeaseDuration: 30 * time.Second, AckDeadline: at(110)},
		{JobID: "expired", LeaseID: "L-e", Generation: 1, HolderIdentity: "w1", State: lease.StateExpired, ExpiresAt: at(150)},
	}
	// Authority that renewals could no longer extend gets no grace either.
	cancelled, conflicted := active("cancelled", 150), active("conflicted", 150)
	cancelled.CancelRequested, cancelled.CancelRequestedAt = true, at(60)
	conflicted.OwnershipConflict, conflicted.ConflictHolder = true, "planner"
	offeredCancelled := lease.Lease{JobID: "offered-cancelled", LeaseID: "L-oc", Generation: 1, HolderIdentity: "w2", State: lease.StateOffered,
		AckState: lease.AckPending, LeaseDuration: 30 * time.Second, AckDeadline: at(110), CancelRequested: true, CancelRequestedAt: at(60)}
	leases = append(leases, cancelled, conflicted, offeredCancelled)
	plan := lease.PlanRestart(leases, lastAlive, restartAt, p)
	want := []lease.Recover{
		{JobID: "offered", LastAlive: lastAlive, ExtendTo: at(230)},
		{JobID: "c", LastAlive: lastAlive, ExtendTo: at(232)},
		{JobID: "a", LastAlive: lastAlive, ExtendTo: at(234)},
		{JobID: "b", LastAlive: lastAlive, ExtendTo: at(236)},
		{JobID: "d", LastAlive: lastAlive, ExtendTo: at(238)},
	}
	if fmt.Sprint(plan) != fmt.Sprint(want) {
		t.Fatalf("plan:\n got  %v\n want %v", plan, want)
	}

	// Every planned recovery is accepted by Step at the restart, and the
	// leases end up alive with the spread deadlines.
	byJob := map[string]lease.Lease{}
	for _, l := range leases {
		byJob[l.JobID] = l
	}
	for _, r := range plan {
		l, d, _ := lease.Step(byJob[r.JobID], r, restartAt, p)
		if d.Outcome != lease.OutcomeAccepted || d.Event != lease.EventRenewed {
			t.Fatalf("recover %s: %s", r.JobID, d)
		}
		if next, _ := lease.NextDeadline(l); !next.Equal(r.ExtendTo) {
			t.Fatalf("recover %s: deadline %v, want %v", r.JobID, next, r.ExtendTo)
		}
	}
	// The leases left out of the plan expire on their first tick, and a
	// recovery that names them anyway is refused: at the last alive
	// instant they had already expired on the coordinator's clock, or
	// their authority could no longer be extended. A cancelled one, its
	// request standing at the end of its authority, is closed UNRESOLVED
	// as it expires (thirty-eighth pass).
	for _, job := range []string{"before-stop", "at-stop", "cancelled", "conflicted", "offered-cancelled"} {
		ended := lease.StateExpired
		if byJob[job].CancelRequested {
			ended = lease.StateTerminal
		}
		l, d, _ := lease.Step(byJob[job], lease.Tick{JobID: job}, restartAt, p)
		switch {
		case ended == lease.StateTerminal && (d.Event != lease.EventResolved || l.TerminalResult != lease.ResultUnresolved):
			t.Fatalf("tick of %s: %s, lease %s %s", job, d, l.State, l.TerminalResult)
		case ended == lease.StateExpired && d.Event != lease.EventLeaseExpired && d.Event != lease.EventAckDeadlineMissed:
			t.Fatalf("tick of %s: %s", job, d)
		}
		r := lease.Recover{JobID: job, LastAlive: lastAlive, ExtendTo: at(230)}
		if l, d, _ := lease.Step(byJob[job], r, restartAt, p); d.Outcome != lease.OutcomeRejected || l.State != ended {
			t.Fatalf("recover %s: %s, lease %s", job, d, l.State)
		}
	}

	p.Restart = lease.RestartStrict
	if plan := lease.PlanRestart(leases, lastAlive, restartAt, p); plan != nil {
		t.Fatalf("strict policy planned %v", plan)
	}
}
