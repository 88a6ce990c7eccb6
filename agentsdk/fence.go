package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

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

// ErrNoAuthority is returned by a Fence with a Check for a side effect
// under the job's current generation when that generation may not act
// now: it is only offered (not accepted), expired, or terminal, its
// holder was asked to cancel or its exit was confirmed, or the
// coordinator recorded an ownership conflict for it. The holder may still believe it holds the lease; the
// coordinator says it does not, and a fenced resource takes its word.
var ErrNoAuthority = errors.New("agentsdk: fence: the lease generation has no authority")

// Authority is the coordinator's answer about a job's lease, as a fence
// needs it.
type Authority struct {
	// Generation is the job's current generation: every generation up to
	// it was issued, and every one below it is superseded.
	Generation uint64
	// Active reports that Generation may act now: its lease is ACTIVE on
	// the coordinator's clock, no cancel was requested, no ownership
	// conflict recorded and its holder's exit not confirmed.
	Active bool
	// Until is when an Active generation's authority ends, as the
	// coordinator stated it (the lease's expiry; renewals move it).
	Until time.Time
	// Why says, when not Active, why Generation may not act ("is
	// EXPIRED", "was asked to cancel", ...).
	Why string
	// CallerRefused reports that the refusal is of the call the check
	// named (a ToolGate call that is neither the holder's nor one of its
	// descendants'), not of the generation, which may still act for its
	// holder: a fence keeps what it knows of the generation.
	CallerRefused bool
}

// GenerationCheck asks the coordinator about job's lease, for a side
// effect claiming generation. It returns an error wrapping
// ErrUnissuedGeneration for a job the coordinator does not know, and
// another error when the coordinator could not be asked.
type GenerationCheck func(ctx context.Context, job string, generation uint64) (Authority, error)

// IssuedGenerations is the GenerationCheck that asks the control plane:
// it reads the job's lease (LeaseService.GetLease, which a tool server's
// credential may call) naming the generation claimed, and answers the
// job's generation and whether it may act now — not when its holder's
// exit was confirmed (the answer's holder_exited; the control plane keeps
// the side effect on the holder as activity after its exit). The read is charged to the
// tool server's reads of that job when the answer admits the generation
// named, and to its refusals otherwise: callers claiming generations that
// are not the job's current one, or that may not act, cannot spend the
// reads its holder's side effects need.
//
// Asked in a ToolGate's handler (ctx carries GateCallID), it names the
// gate's call: the control plane then reads whose call it is from its own
// ledger and keeps a side effect under an exited holder's generation on
// the holder only when the call is the holder's, so a stranger calling the
// tool with the holder's job and generation is refused without framing the
// holder, and a call that is neither the holder's nor one of its
// descendants' is refused under the holder's generation however alive the
// holder is (the answer's not_holders_call): the caller has no authority
// under another agent's lease. The call must be one the gate began with
// the tool-server credential c carries (the fence asks with the gate's own
// credential): another's is refused failed_precondition. Asked elsewhere,
// it names no call: the control plane then cannot tell who asked, admits
// whoever names the holder's job and generation, and weighs the read
// against the holder (docs/design.md §11).
func IssuedGenerations(c *Conn) GenerationCheck {
	return func(ctx context.Context, job string, generation uint64) (Authority, error) {
		resp, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job, LeaseGeneration: generation, CallId: GateCallID(ctx)}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return Authority{}, fmt.Errorf("%w: job %q has no lease", ErrUnissuedGeneration, job)
		}
		if err != nil {
			return Authority{}, fmt.Errorf("agentsdk: fence: asking the coordinator about job %q's lease: %w", job, err)
		}
		return authorityOf(resp.Msg), nil
	}
}

func authorityOf(resp *tetherv1.GetLeaseResponse) Authority {
	l := resp.GetLease()
	a := Authority{Generation: l.GetLeaseGeneration()}
	switch state := l.GetState(); {
	case state != tetherv1.LeaseState_LEASE_STATE_ACTIVE:
		a.Why = "is " + strings.TrimPrefix(state.String(), "LEASE_STATE_")
	case resp.GetNotHoldersCall():
		a.Why, a.CallerRefused = "is not the holder's: the call is neither the holder's nor one of its descendants'", true
	case resp.GetHolderExited():
		a.Why = "is held by an agent whose exit was confirmed"
	case l.GetCancelRequested():
		a.Why = "was asked to cancel"
	case l.GetOwnershipConflict():
		a.Why = "has an unresolved ownership conflict"
	case l.GetExpiresAt() == nil:
		a.Why = "has no expiry" // not an answer the coordinator gives
	default:
		a.Active, a.Until = true, l.GetExpiresAt().AsTime()
	}
	return a
}

// Headers a Fence middleware reads: the job and the lease generation the
// caller holds. A LeaseWorker's Job.Header sets them.
const (
	HeaderJobID           = "Tether-Job-Id"
	HeaderLeaseGeneration = "Tether-Lease-Generation"
)

// MaxJobIDBytes is the longest job id the coordinator accepts (the lease
// record's bound on ids). A fence refuses a longer one, and one that is
// not UTF-8 or holds a control character, as a job the coordinator never
// issued, without asking it and without remembering it.
const MaxJobIDBytes = 256

// jobIDProblem says why job cannot be a job id the coordinator issued, or
// "" when it can. It never quotes job.
func jobIDProblem(job string) string {
	switch {
	case job == "":
		return "the job id is empty"
	case len(job) > MaxJobIDBytes:
		return fmt.Sprintf("a job id of %d bytes (the coordinator issues at most %d)", len(job), MaxJobIDBytes)
	case !utf8.ValidString(job):
		return "a job id that is not UTF-8"
	case strings.IndexFunc(job, unicode.IsControl) >= 0:
		return "a job id holding a control character"
	}
	return ""
}

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
// The generation a request carries is its caller's word, and ordering
// alone does not ask whether that generation may still act. Without a
// Check, anyone who can reach the tool server can send a generation nobody
// holds and so fence the job's real holder out until the fence forgets,
// and a holder whose job was cancelled, expired or ended keeps writing
// until a later generation is seen. A tool server reachable by callers it
// does not trust sets Check (IssuedGenerations with its own credential):
// the fence then admits a side effect only under the job's current
// generation while the coordinator says it may act — ACTIVE, no cancel
// requested, no ownership conflict, its holder's exit not confirmed — and
// raises its highest generation to
// the coordinator's.
//
// A side effect under a generation older than the highest seen is refused
// (ErrFenced) without asking, except behind a ToolGate: the fence then asks
// all the same, naming the gate's call, so that the control plane keeps a
// former holder's side effect after its exit on it (a call's own node
// frames nobody); an ungated fence's read would name no caller.
//
// Freshness: with MaxStale zero (the default) the fence asks for every
// side effect it does not refuse on its own, so a cancel, an expiry, a
// resolution or a reassignment the coordinator has recorded refuses the
// next side effect. With MaxStale set, an answer that the generation may
// act admits that generation's side effects without asking for MaxStale
// from when the fence asked, and never past the expiry the coordinator
// stated (read on Clock): the coordinator's decision takes effect at the
// fence within MaxStale, trading that bound for one ask per generation per
// MaxStale. Answers that refuse are never kept: each refused side effect
// asks again. Behind a ToolGate an answer is kept for the node whose call
// it was asked for, and another agent's call under the same generation is
// asked about (IssuedGenerations names the call; a call that is neither
// the holder's nor one of its descendants' is refused).
type Fence struct {
	// Check, when set, is asked about the job before a side effect is
	// admitted; a refused side effect changes nothing.
	Check GenerationCheck
	// MaxStale is how long an answer that a generation may act is
	// trusted; zero asks for every side effect.
	MaxStale time.Duration
	// Clock reads the time for MaxStale (nil: WallClock).
	Clock Clock

	mu   sync.Mutex
	jobs map[string]fenceJob
}

// fenceJob is what a Fence knows of one job: the highest generation seen,
// and the generation an answer said may act, until when.
type fenceJob struct {
	highest uint64
	active  uint64
	until   time.Time
	// caller is the node of the ToolGate call the answer that active may
	// act was given for ("" for an answer outside a gate): with MaxStale
	// that answer admits that caller's side effects only, so another
	// agent's call under the holder's generation is asked about.
	caller string
}

// Admit decides whether a side effect for job under generation may happen
// and, if so, raises the job's highest generation to it. It returns an
// error wrapping ErrFenced, naming both generations, when a newer one was
// seen.
func (f *Fence) Admit(job string, generation uint64) error {
	return f.AdmitContext(context.Background(), job, generation)
}

// AdmitContext is Admit with the context a Check runs under. With a Check
// the side effect is admitted only under the job's current generation
// while it may act (see Fence); a refusal wraps ErrFenced (an older
// generation), ErrUnissuedGeneration (a generation above the
// coordinator's, or a job it does not know) or ErrNoAuthority, or says why
// the coordinator could not be asked, and admits nothing.
func (f *Fence) AdmitContext(ctx context.Context, job string, generation uint64) error {
	if job == "" || generation == 0 {
		return fmt.Errorf("agentsdk: fence: a side effect needs a job id and a lease generation (got %q, %d)", job, generation)
	}
	if problem := jobIDProblem(job); problem != "" {
		// Neither asked about nor remembered: such a job has no lease,
		// and a caller naming it must not spend the fence's memory, nor
		// a request to the coordinator answered as if it were down.
		return fmt.Errorf("%w: %s", ErrUnissuedGeneration, problem)
	}
	var askedAt time.Time
	if f.MaxStale > 0 {
		askedAt = f.clock().Now()
	}
	caller := gateCallNode(ctx)
	f.mu.Lock()
	e := f.jobs[job]
	if generation < e.highest {
		f.mu.Unlock()
		if f.Check != nil && GateCallID(ctx) != "" {
			// Refused all the same, but asked about: the read names the
			// gate's call, and the control plane keeps a side effect
			// under a superseded generation on the call's node when it
			// held the job (a former holder writing after its exit),
			// which a refusal made here alone never told it. An ungated
			// fence does not ask: its read names no caller, and anyone
			// naming the job and an old generation would frame its
			// former holders.
			if a, err := f.Check(ctx, job, generation); err == nil {
				f.Observe(job, a.Generation)
			}
		}
		return fenced(job, generation, e.highest)
	}
	if f.Check == nil || (f.MaxStale > 0 && generation == e.active && caller == e.caller && askedAt.Before(e.until)) {
		f.observeLocked(job, generation)
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	a, err := f.Check(ctx, job, generation)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observeLocked(job, a.Generation) // issued: older generations are superseded
	e = f.jobs[job]
	switch {
	case generation < e.highest: // superseded, or raised meanwhile
		return fenced(job, generation, e.highest)
	case generation > a.Generation:
		return fmt.Errorf("%w: job %q generation %d is above the coordinator's, %d", ErrUnissuedGeneration, job, generation, a.Generation)
	case !a.Active:
		if e.active == generation && !a.CallerRefused {
			e.active, e.until, e.caller = 0, time.Time{}, ""
			f.jobs[job] = e
		}
		return fmt.Errorf("%w: job %q generation %d %s", ErrNoAuthority, job, generation, a.Why)
	}
	if f.MaxStale > 0 {
		until := askedAt.Add(f.MaxStale)
		if a.Until.Before(until) {
			until = a.Until
		}
		if e.active != generation || e.caller != caller || until.After(e.until) {
			e.active, e.until, e.caller = generation, until, caller
			f.jobs[job] = e
		}
	}
	return nil
}

func (f *Fence) clock() Clock {
	if f.Clock == nil {
		return WallClock
	}
	return f.Clock
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
	if f.jobs == nil {
		f.jobs = make(map[string]fenceJob)
	}
	if e := f.jobs[job]; generation > e.highest {
		e.highest = generation
		f.jobs[job] = e
	}
}

// Highest returns the highest generation seen for job (0 if none).
func (f *Fence) Highest(job string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.jobs[job].highest
}

// Middleware fences an HTTP tool: a request must carry HeaderJobID and
// HeaderLeaseGeneration, once each; one from a superseded generation is
// answered 409 Conflict, one whose generation the Check refused (unissued,
// or without authority) 403 Forbidden (503 when the coordinator could not
// be asked), and none of them reaches next; a request without them, or
// whose job id the coordinator could not have issued (MaxJobIDBytes), is
// answered 400 before anything is asked.
func (f *Fence) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		job, generation, problem := fencingHeaders(r.Header)
		if problem != "" {
			http.Error(w, "fenced tool: "+problem, http.StatusBadRequest)
			return
		}
		if err := f.AdmitContext(r.Context(), job, generation); err != nil {
			code := http.StatusConflict
			switch {
			case errors.Is(err, ErrUnissuedGeneration), errors.Is(err, ErrNoAuthority):
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

// fencingHeaders reads a request's job id and generation, or says what is
// wrong with them: each header once (a request naming two generations
// could be read one way here and another by the tool), the generation a
// positive decimal integer without sign or leading zero, as the
// TypeScript and Python fences read it.
func fencingHeaders(h http.Header) (job string, generation uint64, problem string) {
	required := HeaderJobID + " and " + HeaderLeaseGeneration + " (a positive integer) are required, once each"
	jobs, generations := h.Values(HeaderJobID), h.Values(HeaderLeaseGeneration)
	if len(jobs) != 1 || len(generations) != 1 || jobs[0] == "" {
		return "", 0, required
	}
	raw := generations[0]
	if raw == "" || raw[0] < '1' || raw[0] > '9' {
		return "", 0, required
	}
	generation, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		return "", 0, required
	}
	if p := jobIDProblem(jobs[0]); p != "" {
		return "", 0, HeaderJobID + " is not a job the coordinator issues: " + p
	}
	return jobs[0], generation, ""
}
