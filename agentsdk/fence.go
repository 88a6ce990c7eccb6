package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// ErrFenced is returned by Fence.Admit for a side effect carrying a lease
// generation lower than the highest the fence has seen for its job: the
// caller's lease was superseded, so it no longer has authority to act.
var ErrFenced = errors.New("agentsdk: fenced: a newer lease generation exists for the job")

// ErrUnissuedGeneration is returned by a Fence with a Check for a side
// effect claiming a generation the coordinator has not issued for its job:
// the header is the caller's word, and a caller that could raise the fence
// to a generation nobody holds would fence the real holder out.
var ErrUnissuedGeneration = errors.New("agentsdk: fence: the lease generation was not issued for the job")

// GenerationCheck confirms that generation was issued for job (it is the
// job's current generation or an earlier one). A Fence calls it before it
// raises a job's highest generation, never for a generation it has seen.
type GenerationCheck func(ctx context.Context, job string, generation uint64) error

// IssuedGenerations is the GenerationCheck that asks the control plane:
// it reads the job's lease (LeaseService.GetLease, which a tool server's
// credential may call) and refuses a generation above the lease's with
// ErrUnissuedGeneration, and a job the coordinator does not know the
// same way.
func IssuedGenerations(c *Conn) GenerationCheck {
	return func(ctx context.Context, job string, generation uint64) error {
		resp, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return fmt.Errorf("%w: job %q has no lease", ErrUnissuedGeneration, job)
		}
		if err != nil {
			return fmt.Errorf("agentsdk: fence: asking the coordinator for job %q's generation: %w", job, err)
		}
		if current := resp.Msg.GetLease().GetLeaseGeneration(); generation > current {
			return fmt.Errorf("%w: job %q generation %d is above the coordinator's, %d", ErrUnissuedGeneration, job, generation, current)
		}
		return nil
	}
}

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
//
// The generation a request carries is its caller's word. Without a Check,
// anyone who can reach the tool server can send a generation nobody holds
// and so fence the job's real holder out until the fence forgets; a tool
// server reachable by callers it does not trust sets Check (for example
// IssuedGenerations with its own credential), which the fence asks before
// it raises a job's highest generation: once per generation, not per call.
type Fence struct {
	// Check, when set, confirms a generation above the highest seen
	// before the fence raises to it; a refused one is not admitted and
	// changes nothing.
	Check GenerationCheck

	mu      sync.Mutex
	highest map[string]uint64
}

// Admit decides whether a side effect for job under generation may happen
// and, if so, raises the job's highest generation to it. It returns an
// error wrapping ErrFenced, naming both generations, when a newer one was
// seen.
func (f *Fence) Admit(job string, generation uint64) error {
	return f.AdmitContext(context.Background(), job, generation)
}

// AdmitContext is Admit with the context a Check runs under. A
// generation above the highest seen is admitted only once Check (if set)
// confirms it; a refusal wraps ErrUnissuedGeneration (or says why the
// coordinator could not be asked) and raises nothing.
func (f *Fence) AdmitContext(ctx context.Context, job string, generation uint64) error {
	if job == "" || generation == 0 {
		return fmt.Errorf("agentsdk: fence: a side effect needs a job id and a lease generation (got %q, %d)", job, generation)
	}
	f.mu.Lock()
	h := f.highest[job]
	if generation < h {
		f.mu.Unlock()
		return fenced(job, generation, h)
	}
	if generation == h || f.Check == nil {
		f.observeLocked(job, generation)
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	if err := f.Check(ctx, job, generation); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.highest[job]; generation < h { // raised meanwhile
		return fenced(job, generation, h)
	}
	f.observeLocked(job, generation)
	return nil
}

func fenced(job string, generation, highest uint64) error {
	return fmt.Errorf("%w: job %q generation %d is older than generation %d", ErrFenced, job, generation, highest)
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
// Conflict, one whose generation the Check refused 403 Forbidden (503 when
// the coordinator could not be asked), and neither reaches next; a request
// without them is answered 400.
func (f *Fence) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		job := r.Header.Get(HeaderJobID)
		generation, err := strconv.ParseUint(r.Header.Get(HeaderLeaseGeneration), 10, 64)
		if job == "" || err != nil || generation == 0 {
			http.Error(w, "fenced tool: "+HeaderJobID+" and "+HeaderLeaseGeneration+" (a positive integer) are required", http.StatusBadRequest)
			return
		}
		if err := f.AdmitContext(r.Context(), job, generation); err != nil {
			code := http.StatusConflict
			switch {
			case errors.Is(err, ErrUnissuedGeneration):
				code = http.StatusForbidden
			case !errors.Is(err, ErrFenced):
				code = http.StatusServiceUnavailable
			}
			http.Error(w, err.Error(), code)
			return
		}
		next.ServeHTTP(w, r)
	})
}
