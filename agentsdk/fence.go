package agentsdk

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// ErrFenced is returned by Fence.Admit for a side effect carrying a lease
// generation lower than the highest the fence has seen for its job: the
// caller's lease was superseded, so it no longer has authority to act.
var ErrFenced = errors.New("agentsdk: fenced: a newer lease generation exists for the job")

// Headers a Fence middleware reads: the job and the lease generation the
// caller holds. A LeaseWorker's Job.Header sets them.
const (
	HeaderJobID           = "Tether-Job-Id"
	HeaderLeaseGeneration = "Tether-Lease-Generation"
)

// Fence is the tool server's half of lease fencing: every side effect
// carries the job id and the lease generation its caller holds, and the
// fence rejects one whose generation is lower than the highest it has seen
// for that job. A worker whose lease expired and was reassigned (generation
// + 1) can therefore no longer write, even if it never heard that it lost
// the lease. Equal generations pass: one holder's calls are not ordered
// against each other.
//
// The fence remembers generations in memory. A tool server that must keep
// fencing across its own restarts stores the highest generation beside the
// side effect (for example in the same database transaction) and seeds the
// fence with Observe on start-up. The zero value is ready to use; it is
// safe for concurrent use.
type Fence struct {
	mu      sync.Mutex
	highest map[string]uint64
}

// Admit decides whether a side effect for job under generation may happen
// and, if so, raises the job's highest generation to it. It returns an
// error wrapping ErrFenced, naming both generations, when a newer one was
// seen.
func (f *Fence) Admit(job string, generation uint64) error {
	if job == "" || generation == 0 {
		return fmt.Errorf("agentsdk: fence: a side effect needs a job id and a lease generation (got %q, %d)", job, generation)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.highest[job]; generation < h {
		return fmt.Errorf("%w: job %q generation %d is older than generation %d", ErrFenced, job, generation, h)
	}
	f.observeLocked(job, generation)
	return nil
}

// Observe raises the job's highest generation without admitting anything
// (seeding the fence from storage, or from a coordinator answer).
func (f *Fence) Observe(job string, generation uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observeLocked(job, generation)
}

func (f *Fence) observeLocked(job string, generation uint64) {
	if f.highest == nil {
		f.highest = make(map[string]uint64)
	}
	if generation > f.highest[job] {
		f.highest[job] = generation
	}
}

// Highest returns the highest generation seen for job (0 if none).
func (f *Fence) Highest(job string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest[job]
}

// Middleware fences an HTTP tool: a request must carry HeaderJobID and
// HeaderLeaseGeneration; one from a superseded generation is answered 409
// Conflict and never reaches next, a request without them 400.
func (f *Fence) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		job := r.Header.Get(HeaderJobID)
		generation, err := strconv.ParseUint(r.Header.Get(HeaderLeaseGeneration), 10, 64)
		if job == "" || err != nil || generation == 0 {
			http.Error(w, "fenced tool: "+HeaderJobID+" and "+HeaderLeaseGeneration+" (a positive integer) are required", http.StatusBadRequest)
			return
		}
		if err := f.Admit(job, generation); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		next.ServeHTTP(w, r)
	})
}
