package lease

import (
	"container/heap"
	"sort"
	"time"
)

// Deadline is when a job next needs a Tick.
type Deadline struct {
	JobID string
	At    time.Time
}

// DeadlineQueue finds the jobs whose deadline has passed. It only finds
// them: acting on an expiry is a separate Step(Tick) by the shell, which
// then re-pushes NextDeadline of the new lease. It is a min-heap on At with
// a job-id index, so Push, Update and Remove are O(log n). It is not safe
// for concurrent use: it belongs to the goroutine that owns the leases.
type DeadlineQueue struct {
	h deadlineHeap
}

// Len reports how many jobs have a pending deadline.
func (q *DeadlineQueue) Len() int { return len(q.h.items) }

// Push sets the job's deadline, inserting it or moving an existing one.
func (q *DeadlineQueue) Push(jobID string, at time.Time) {
	if q.Update(jobID, at) {
		return
	}
	if q.h.index == nil {
		q.h.index = make(map[string]int)
	}
	heap.Push(&q.h, Deadline{JobID: jobID, At: at})
}

// Update moves the deadline of a job already queued and reports whether
// it was.
func (q *DeadlineQueue) Update(jobID string, at time.Time) bool {
	i, ok := q.h.index[jobID]
	if !ok {
		return false
	}
	q.h.items[i].At = at
	heap.Fix(&q.h, i)
	return true
}

// Remove drops the job's deadline and reports whether it had one.
func (q *DeadlineQueue) Remove(jobID string) bool {
	i, ok := q.h.index[jobID]
	if !ok {
		return false
	}
	heap.Remove(&q.h, i)
	return true
}

// Peek returns the earliest deadline without removing it.
func (q *DeadlineQueue) Peek() (Deadline, bool) {
	if len(q.h.items) == 0 {
		return Deadline{}, false
	}
	return q.h.items[0], true
}

// PopDue removes and returns every deadline at or before now, earliest
// first (ties by job id, so the order is deterministic).
func (q *DeadlineQueue) PopDue(now time.Time) []Deadline {
	var due []Deadline
	for len(q.h.items) > 0 && !q.h.items[0].At.After(now) {
		due = append(due, heap.Pop(&q.h).(Deadline))
	}
	return due
}

// Sync makes the queue reflect a lease after a Step: its NextDeadline is
// pushed, or the job is removed when nothing is pending.
func (q *DeadlineQueue) Sync(l Lease) {
	if at, ok := NextDeadline(l); ok {
		q.Push(l.JobID, at)
		return
	}
	q.Remove(l.JobID)
}

type deadlineHeap struct {
	items []Deadline
	index map[string]int
}

func (h *deadlineHeap) Len() int { return len(h.items) }

func (h *deadlineHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if !a.At.Equal(b.At) {
		return a.At.Before(b.At)
	}
	return a.JobID < b.JobID
}

func (h *deadlineHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.index[h.items[i].JobID] = i
	h.index[h.items[j].JobID] = j
}

func (h *deadlineHeap) Push(x any) {
	d := x.(Deadline)
	h.index[d.JobID] = len(h.items)
	h.items = append(h.items, d)
}

func (h *deadlineHeap) Pop() any {
	n := len(h.items) - 1
	d := h.items[n]
	h.items[n] = Deadline{}
	h.items = h.items[:n]
	delete(h.index, d.JobID)
	return d
}

// PlanRestart is the restart helper. Given the leases loaded from the store,
// the last time the previous coordinator is known to have been deciding
// (lastAlive: its clean stop, or its last committed decision after a crash)
// and the restart time, it returns the Recover messages the shell steps
// before serving traffic.
//
// Under RestartExtend, every OFFERED or ACTIVE lease whose deadline fell in
// (lastAlive, restartAt + RestartGrace) gets a new deadline in
// [restartAt + RestartGrace, restartAt + RestartGrace + RestartSpread),
// assigned in the order of the original deadlines (ties by job id), evenly
// spaced, so the pile-up left by the downtime does not expire — or get
// reassigned — all at once. Deadlines up to lastAlive passed while the
// coordinator was still up (a lease has no authority at its deadline's
// instant): they are not extended and expire on their first Tick. Nor is a
// lease with a cancel request or a recorded ownership conflict: its holder
// could not have renewed anyway, so the downtime took nothing from it, and
// its authority ends at the deadline it had. Under RestartStrict the plan
// is empty.
func PlanRestart(leases []Lease, lastAlive, restartAt time.Time, p Policy) []Recover {
	if p.Restart != RestartExtend {
		return nil
	}
	floor := restartAt.Add(p.RestartGrace)
	var pending []Deadline
	for _, l := range leases {
		if l.State != StateOffered && l.State != StateActive || l.CancelRequested || l.OwnershipConflict {
			continue
		}
		at, _ := NextDeadline(l)
		if !at.After(lastAlive) || !at.Before(floor) {
			continue
		}
		pending = append(pending, Deadline{JobID: l.JobID, At: at})
	}
	sort.Slice(pending, func(i, j int) bool {
		if !pending[i].At.Equal(pending[j].At) {
			return pending[i].At.Before(pending[j].At)
		}
		return pending[i].JobID < pending[j].JobID
	})
	plan := make([]Recover, len(pending))
	for i, d := range pending {
		offset := time.Duration(0)
		if n := len(pending); n > 1 {
			offset = time.Duration(int64(p.RestartSpread) / int64(n) * int64(i))
		}
		plan[i] = Recover{JobID: d.JobID, LastAlive: lastAlive, ExtendTo: floor.Add(offset)}
	}
	return plan
}
