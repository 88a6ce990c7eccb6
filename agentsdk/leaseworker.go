package agentsdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Causes of a Job's context.
var (
	// ErrLeaseCancelled: the coordinator requested cancellation. The job
	// should stop and Complete with CANCELLED (or FAILED).
	ErrLeaseCancelled = errors.New("agentsdk: the coordinator requested cancellation of the job")
	// ErrLeaseLost: the coordinator says this generation no longer has
	// authority (it expired, was superseded, or the job is terminal), or
	// an answer named another job, or another lease of this one (not this
	// job's answer: nothing in it is taken, and the job's own never came;
	// the cause wraps ErrLeaseLost and names the ids, clipped).
	ErrLeaseLost = errors.New("agentsdk: the lease is no longer held")
	// ErrLeaseUnconfirmed: no renewal (nor the ACK) the coordinator
	// accepted covers now on the worker's clock — the last accepted one's
	// send time plus the lease duration has passed — so the job cannot
	// prove it still has authority (the coordinator counted that window
	// from its receipt, no earlier). It wraps ErrLeaseLost.
	ErrLeaseUnconfirmed = fmt.Errorf("%w: no renewal the coordinator accepted covers the worker's clock any more; authority cannot be proven (the coordinator was not reached)", ErrLeaseLost)
	// ErrJobEnded: the job was completed or stopped by its worker.
	ErrJobEnded = errors.New("agentsdk: the job ended")
	// ErrWorkerClosed: the job's LeaseWorker was closed. It is the cause
	// of the context of every job the worker ran (wrapping ErrJobEnded),
	// and what Accept, Renew, Progress and Complete return once it is
	// closed: nothing is sent after Close.
	ErrWorkerClosed = fmt.Errorf("%w: its lease worker was closed", ErrJobEnded)
	// ErrOwnershipConflict: another identity claimed this generation and
	// the coordinator recorded an ownership conflict. Execution must halt:
	// renewals no longer extend authority and completion is refused until
	// the coordinator resolves the conflict (a new generation, or a final
	// result). The cause is an *OwnershipConflictError naming the lease.
	ErrOwnershipConflict = errors.New("agentsdk: ownership conflict recorded on the lease; execution halted until the coordinator resolves it")
)

// OwnershipConflictError is the cause of a job's context when the
// coordinator recorded an ownership conflict on its lease. It wraps
// ErrOwnershipConflict.
type OwnershipConflictError struct {
	JobID      string
	LeaseID    string
	Generation uint64
	// Reason is the coordinator's decision reason, when the conflict was
	// learnt from a rejected message.
	Reason string
}

func (e *OwnershipConflictError) Error() string {
	msg := fmt.Sprintf("agentsdk: ownership conflict recorded on job %q lease %q generation %d; execution halted until the coordinator resolves it", e.JobID, e.LeaseID, e.Generation)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

func (e *OwnershipConflictError) Unwrap() error { return ErrOwnershipConflict }

// ErrSpooled is returned by Job.Progress and Job.Complete when the control
// plane did not judge the message (it could not be reached, or refused it
// for now, e.g. resource_exhausted for its rate limit): the message is in
// the spool, synced to disk, and will be replayed with its original
// sequence and sent_at. The error wraps ErrSpooled and the cause, so
// connect.CodeOf tells a rate-limit refusal from an unreachable server.
var ErrSpooled = errors.New("agentsdk: the control plane did not judge the message (unreachable, or refused it for now); it is spooled for replay")

// LeaseWorkerConfig configures a LeaseWorker.
type LeaseWorkerConfig struct {
	// Conn is the agent's connection: its credential is the holder
	// identity the coordinator binds every message to.
	Conn *Conn
	// SpoolDir is where progress and results wait, durably, while the
	// control plane is unreachable. Required; one LeaseWorker per
	// directory at a time.
	SpoolDir string
	// Clock stamps sent_at (evidence only: the coordinator decides on
	// its own clock). Nil means WallClock.
	Clock Clock
	// RenewEvery is how often a job renews; 0 means a third of its lease
	// duration. It schedules renewals: expiry is whatever the
	// coordinator answers. With an injected Clock the job's own bound
	// (ErrLeaseUnconfirmed) is checked at each of these ticks; on the
	// wall clock a timer ends the job at it.
	RenewEvery time.Duration
	Log        *slog.Logger
}

// LeaseWorker works under fenced job leases for one agent: it ACKs offers,
// keeps each job's lease renewed until the coordinator says it ended,
// reports progress and terminal results, turns a cancel request into
// context cancellation plus a callback and an acknowledgement, and keeps
// what it could not deliver in an append-only, fsynced spool that it
// replays, in order, once the control plane answers again.
type LeaseWorker struct {
	cfg   LeaseWorkerConfig
	spool *spool
	// sendMu keeps delivery in spool order: nothing new is sent directly
	// while older messages wait in the spool.
	sendMu sync.Mutex
	// sending is held (read) by every send from its check that the worker
	// is open until it has been answered; Close takes it (write) once the
	// worker is closed, so that nothing is sent after Close returns.
	sending sync.RWMutex

	// mu guards closed and jobs: the jobs whose renew loop runs, which
	// Close ends.
	mu     sync.Mutex
	closed bool
	jobs   map[*Job]struct{}
}

// closeWait bounds how long Close waits for its jobs' renew loops to
// end: each stops at once (its renewal in flight is cancelled), and Close
// does not wait for one running OnCancel. The bound is counted on the
// worker's clock when that clock keeps timers (a test's manual clock).
const closeWait = 10 * time.Second

// NewLeaseWorker opens (or creates) the spool. Messages left there by an
// earlier process are replayed by Replay or before the next delivery.
func NewLeaseWorker(cfg LeaseWorkerConfig) (*LeaseWorker, error) {
	if cfg.Conn == nil {
		return nil, errors.New("agentsdk: LeaseWorker needs a Conn")
	}
	if cfg.SpoolDir == "" {
		return nil, errors.New("agentsdk: LeaseWorker needs a SpoolDir")
	}
	if cfg.Clock == nil {
		cfg.Clock = WallClock
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	sp, err := openSpool(filepath.Join(cfg.SpoolDir, "lease-spool.jsonl"))
	if err != nil {
		return nil, err
	}
	return &LeaseWorker{cfg: cfg, spool: sp, jobs: map[*Job]struct{}{}}, nil
}

// Close ends every job the worker runs, as Job.Stop does but with the
// cause ErrWorkerClosed (their contexts end, their renewals stop, one in
// flight is cancelled; each lease runs out on the coordinator's clock),
// waits for their renew loops to end and for the sends under way (a
// Progress or Complete that found the worker open: each is answered
// before Close returns; at most 10 s in all), and closes the spool: what
// it holds is replayed by the next LeaseWorker on the directory. From
// then on the worker sends nothing: Accept, Renew, Progress and Complete
// return ErrWorkerClosed. Close is idempotent.
//
// Close may be called from a job's OnCancel (the operator cancelled the
// job: the agent shuts down). It does not wait for a renew loop that is
// running OnCancel, which may be the caller: that loop ends when OnCancel
// returns, and the cancel request is then not acknowledged (the worker
// sends nothing after Close; the lease runs out on the coordinator's
// clock).
func (w *LeaseWorker) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	jobs := make([]*Job, 0, len(w.jobs))
	for j := range w.jobs {
		jobs = append(jobs, j)
	}
	w.mu.Unlock()
	for _, j := range jobs {
		j.end(ErrWorkerClosed)
	}
	bound, stop := w.closeBound()
	defer stop()
	for _, j := range jobs {
		if j.cancelling() {
			// Its renew loop runs OnCancel, which may be what called
			// Close: that loop ends when OnCancel returns (the worker,
			// closed, sends the cancel's acknowledgement no more), and
			// waiting for it here would wait for ever on the caller.
			continue
		}
		select {
		case <-j.done:
		case <-bound:
			w.cfg.Log.Warn("lease worker closed with a job's renew loop still running (an OnCancel it runs has not returned)", "job", j.jobID)
			return w.spool.close()
		}
	}
	// A send that found the worker open before it closed (a Progress or
	// Complete of the agent's, a renewal) goes out before Close returns,
	// not after: an agent that closes its worker and then claims its exit
	// has no lease message land after the claim. (No send holds it while
	// OnCancel runs: Close may be called from there.)
	if hook := beforeCloseWaitsForSends.Load(); hook != nil {
		(*hook)(w)
	}
	sent := make(chan struct{})
	go func() {
		w.sending.Lock() // every send under way has ended
		close(sent)
		w.sending.Unlock()
	}()
	select {
	case <-sent:
	case <-bound:
		w.cfg.Log.Warn("lease worker closed with a send still under way")
	}
	return w.spool.close()
}

// closeBound starts Close's closeWait on the worker's clock: an injected
// clock that keeps timers (a test's manual clock) counts it, the wall
// clock otherwise.
func (w *LeaseWorker) closeBound() (<-chan time.Time, func()) {
	if c, ok := w.cfg.Clock.(interface {
		NewTimer(time.Duration) clock.Timer
	}); ok {
		t := c.NewTimer(closeWait)
		return t.C(), func() { t.Stop() }
	}
	t := time.NewTimer(closeWait)
	return t.C, func() { t.Stop() }
}

// afterOpenCheck and beforeCloseWaitsForSends, set by tests only: the
// first runs in send between its check that the worker is open and the
// send; the second in Close before it waits for the sends under way.
var afterOpenCheck, beforeCloseWaitsForSends atomic.Pointer[func(w *LeaseWorker)]

// isClosed reports whether Close was called.
func (w *LeaseWorker) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// track records a job whose renew loop is about to run, so that Close
// ends it; it reports false (and records nothing) once the worker is
// closed.
func (w *LeaseWorker) track(j *Job) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.jobs[j] = struct{}{}
	return true
}

func (w *LeaseWorker) untrack(j *Job) {
	w.mu.Lock()
	delete(w.jobs, j)
	w.mu.Unlock()
}

// Pending reports how many messages wait in the spool.
func (w *LeaseWorker) Pending() int { return w.spool.len() }

// Replay delivers the spooled messages in order and returns how many the
// coordinator answered. It stops at the first one the control plane could
// not be reached for. Each is judged on its own identity, generation and
// sequence: a result from a generation that expired meanwhile is recorded
// as evidence and rejected, never accepted.
func (w *LeaseWorker) Replay(ctx context.Context) (int, error) {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	return w.replayLocked(ctx)
}

func (w *LeaseWorker) replayLocked(ctx context.Context) (int, error) {
	delivered := 0
	for {
		e, ok := w.spool.first()
		if !ok {
			return delivered, nil
		}
		_, d, err := w.send(ctx, e.req)
		if err != nil && retryable(err) {
			return delivered, err
		}
		if err != nil {
			// It can never be judged (malformed, or not ours): drop it
			// rather than block everything behind it.
			w.cfg.Log.Warn("lease spool: dropping a message the control plane refuses", "error", err)
		} else {
			w.cfg.Log.Debug("lease spool: replayed", "decision", d.GetOutcome().String(), "event", d.GetAuditEvent().String())
		}
		if err := w.spool.done(e.id); err != nil {
			return delivered, err
		}
		delivered++
	}
}

// deliver sends req now or, when the control plane is unreachable (or
// older messages still wait), appends it to the spool.
func (w *LeaseWorker) deliver(ctx context.Context, req *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, error) {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	if w.isClosed() {
		return nil, nil, ErrWorkerClosed
	}
	if w.spool.len() > 0 {
		if _, rerr := w.replayLocked(ctx); rerr != nil {
			if err := w.spool.append(req); err != nil {
				return nil, nil, err
			}
			return nil, nil, fmt.Errorf("%w: %w", ErrSpooled, rerr)
		}
	}
	l, d, err := w.send(ctx, req)
	if err != nil && retryable(err) {
		if serr := w.spool.append(req); serr != nil {
			return nil, nil, serr
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrSpooled, err)
	}
	return l, d, err
}

// retryable reports whether err means "not judged, try again later"
// rather than "judged" or "never judgeable".
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeNotFound,
		connect.CodeUnimplemented, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return false
	}
	return true
}

func (w *LeaseWorker) send(ctx context.Context, req *tetherv1.ChannelRequest) (*tetherv1.Lease, *tetherv1.Decision, error) {
	w.sending.RLock()
	defer w.sending.RUnlock()
	if w.isClosed() {
		return nil, nil, ErrWorkerClosed
	}
	if hook := afterOpenCheck.Load(); hook != nil {
		(*hook)(w)
	}
	c := w.cfg.Conn.Lease
	switch m := req.Message.(type) {
	case *tetherv1.ChannelRequest_Ack:
		return leaseCall(ctx, c.Ack, m.Ack)
	case *tetherv1.ChannelRequest_Renew:
		return leaseCall(ctx, c.Renew, m.Renew)
	case *tetherv1.ChannelRequest_Progress:
		return leaseCall(ctx, c.Progress, m.Progress)
	case *tetherv1.ChannelRequest_CancelAck:
		return leaseCall(ctx, c.CancelAck, m.CancelAck)
	case *tetherv1.ChannelRequest_Complete:
		return leaseCall(ctx, c.Complete, m.Complete)
	default:
		return nil, nil, fmt.Errorf("agentsdk: empty lease message")
	}
}

// leaseAnswer is what every lease RPC answers: the lease and the decision.
type leaseAnswer interface {
	GetLease() *tetherv1.Lease
	GetDecision() *tetherv1.Decision
}

// leaseCall sends msg with the unary lease RPC call and returns its answer.
func leaseCall[Req, Resp any, A interface {
	*Resp
	leaseAnswer
}](ctx context.Context, call func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), msg *Req) (*tetherv1.Lease, *tetherv1.Decision, error) {
	r, err := call(ctx, connect.NewRequest(msg))
	if err != nil {
		return nil, nil, err
	}
	a := A(r.Msg)
	return a.GetLease(), a.GetDecision(), nil
}

// JobOptions configure one accepted job.
type JobOptions struct {
	// OnCancel runs when the coordinator's cancel request is first seen,
	// after the job's context was cancelled and before the worker
	// acknowledges the request. It must return once the job has stopped
	// starting new work. It may close the worker (LeaseWorker.Close does
	// not wait for the job whose OnCancel runs; the request is then not
	// acknowledged).
	OnCancel func(l *tetherv1.Lease)
}

// Job is the work done under one generation of one job's lease.
type Job struct {
	w    *LeaseWorker
	opts JobOptions

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	// halted ends when the job does (end): the renew loop's renewal in
	// flight is cancelled with it, so that nothing holds the loop (and
	// Close) once the job ended.
	halted context.Context
	halt   context.CancelFunc

	// The generation this Job accepted. Every message it sends and its
	// fencing header speak for it, whatever later generation an answer
	// shows: a Job that lost its lease must never pass for its successor.
	jobID, leaseID string
	generation     uint64
	// duration is the generation's lease duration as offered, or, when
	// the offer named none, as the ACK's answer named it (0: neither
	// did): the coordinator fixes it for the generation (no renewal
	// changes it), so an answer naming a longer one is not taken for the
	// job's window nor its renew interval. Taken from the answers,
	// a path's one forged ACK answer naming a day had the job renew every
	// 8 hours, never again within its lease, deaf to its cancel request
	// and working on past its lease's expiry at the coordinator (rogue44a
	// test).
	duration time.Duration

	mu          sync.Mutex
	lease       *tetherv1.Lease
	renewSeq    uint64
	progressSeq uint64
	cancelSeen  bool
	// inOnCancel is set while the job runs its OnCancel: Close does not
	// wait for such a job (the callback may be what called it).
	inOnCancel bool
	// heldUntil bounds the authority the job can prove, on the worker's
	// clock (heldNow): the send time of the last ACK or renewal the
	// coordinator accepted, plus the lease duration. Zero: not known yet.
	heldUntil time.Time
	// heldTimer ends the job at heldUntil on the wall clock; with an
	// injected clock the renew loop checks at each tick instead.
	heldTimer *time.Timer
}

// Accept ACKs an offered lease (which must be this agent's) and starts
// renewing it. The job's context ends when the coordinator requests
// cancellation (cause ErrLeaseCancelled), says the generation lost
// authority (ErrLeaseLost; an answer naming another job, or another lease
// of this one, ends it so too: it is not this job's answer) or records an ownership conflict on it
// (*OwnershipConflictError, wrapping ErrOwnershipConflict), when no
// accepted renewal covers the worker's clock any more
// (ErrLeaseUnconfirmed), or when the worker ends it (ErrJobEnded; the
// worker's Close: ErrWorkerClosed, which wraps it; a renewal the control
// plane refuses because the agent may not act — its node's exit was
// confirmed, or its credential is dead — an ErrJobEnded carrying that
// failed_precondition, unauthenticated or permission_denied). A closed worker
// returns ErrWorkerClosed without acknowledging anything. An ACK refused,
// or answered with no lease, returns an error and no job.
func (w *LeaseWorker) Accept(ctx context.Context, offered *tetherv1.Lease, opts JobOptions) (*Job, *tetherv1.Decision, error) {
	if w.isClosed() {
		return nil, nil, ErrWorkerClosed
	}
	sentAt := w.heldNow()
	req := &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Ack{Ack: &tetherv1.AckRequest{
		JobId: offered.GetJobId(), LeaseId: offered.GetLeaseId(), LeaseGeneration: offered.GetLeaseGeneration(), SentAt: timestamppb.New(w.cfg.Clock.Now()),
	}}}
	w.sendMu.Lock()
	if _, err := w.replayLocked(ctx); err != nil {
		w.sendMu.Unlock()
		return nil, nil, err
	}
	l, d, err := w.send(ctx, req) // an ACK is never spooled: a late ACK is worthless
	w.sendMu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if d.GetOutcome() == tetherv1.Outcome_OUTCOME_REJECTED {
		return nil, d, fmt.Errorf("agentsdk: ack of job %q refused: %s %s", offered.GetJobId(), d.GetAuditEvent(), d.GetReason())
	}
	if l == nil {
		// An answer with no lease (a path's forged one): nothing of the
		// coordinator's to run under. Refused, as the TypeScript and
		// Python workers refuse it; the job began on it, its Lease() nil
		// (rogue44j test).
		return nil, d, fmt.Errorf("agentsdk: ack of job %q refused: no lease in the answer", offered.GetJobId())
	}
	jctx, cancel := context.WithCancelCause(context.Background())
	halted, halt := context.WithCancel(context.Background())
	j := &Job{w: w, opts: opts, ctx: jctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), lease: l,
		halted: halted, halt: halt,
		jobID: offered.GetJobId(), leaseID: offered.GetLeaseId(), generation: offered.GetLeaseGeneration(),
		duration: max(offered.GetLeaseDuration().AsDuration(), 0)}
	if l != nil && namesAnother(l, j.jobID, j.leaseID) != "" {
		// Not this job's answer (observe ends the job): its lease is the
		// one offered, not the one the answer names.
		j.lease = offered
	} else if j.duration == 0 {
		// An offer that names no duration (one its caller built from the
		// ids it was handed): the ACK's answer fixes the generation's, as
		// the offer's would, and no later answer lengthens it. Taken from
		// each answer, one forged accepted renewal naming a day moved the
		// job's bound a day on, and cut off from its coordinator after it
		// the job worked on past its lease's expiry for the day (rogue46c
		// test).
		j.duration = max(l.GetLeaseDuration().AsDuration(), 0)
	}
	if !w.track(j) {
		// Closed while the ACK was under way: the job ends before it
		// begins, and its lease runs out on the coordinator's clock.
		j.end(ErrWorkerClosed)
		return nil, d, ErrWorkerClosed
	}
	if l.GetLeaseGeneration() == j.generation && namesAnother(l, j.jobID, j.leaseID) == "" {
		// A job this agent already held (its ACK a DUPLICATE: a process
		// restarted after it renewed and reported progress) goes on from
		// the sequences the coordinator accepted, not from 0 again, which
		// would have its renewals refused stale until the lease lapsed and
		// its reports kept as late progress.
		j.renewSeq, j.progressSeq = l.GetRenewSequence(), l.GetProgressSequence()
	}
	// The ACK's answer is acted on as any other: such a job's lease may
	// already carry a cancel request (or a conflict), and its work must
	// not begin as if it did not.
	j.held(sentAt, l, d)
	j.observe(ctx, l, j.generation, d)
	if d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && j.ctx.Err() == nil {
		// A repeated ACK grants no window (the coordinator counted the
		// generation's from the first ACK or the last renewal, whenever
		// that was): the resumed job proves one with a renewal now, and
		// without an answer it has none and ends (ErrLeaseUnconfirmed).
		j.mu.Lock()
		j.heldUntil = sentAt
		j.mu.Unlock()
		// Cancelled if the job ends meanwhile (the worker's Close), as the
		// renew loop's renewals are.
		rctx, cancel := context.WithCancel(ctx)
		unhook := context.AfterFunc(j.halted, cancel)
		if _, err := j.Renew(rctx); err != nil && !errors.Is(err, ErrWorkerClosed) && j.halted.Err() == nil {
			j.w.cfg.Log.Warn("lease renew of a resumed job failed", "job", j.jobID, "error", err)
		}
		unhook()
		cancel()
		j.checkHeld()
	}
	go j.renewLoop()
	return j, d, nil
}

// heldNow is the worker's own time for the bound of a job's authority:
// the monotonic clock when the worker runs on the wall clock (a wall
// clock step must not stretch it), the injected clock otherwise.
func (w *LeaseWorker) heldNow() time.Time {
	if _, wall := w.cfg.Clock.(wallClock); wall {
		return time.Now()
	}
	return w.cfg.Clock.Now()
}

// held extends the bound of the job's authority after an answer to a
// message sent at sentAt (heldNow): only an accepted ACK or renewal of the
// job's own generation grants a window, which the coordinator counts from
// its receipt, so sentAt plus the lease duration is never later than the
// expiry it set. Progress renews nothing, and neither does a repeat.
func (j *Job) held(sentAt time.Time, l *tetherv1.Lease, d *tetherv1.Decision) {
	if l == nil || d.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED || l.GetLeaseGeneration() != j.generation ||
		l.GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE || namesAnother(l, j.jobID, j.leaseID) != "" {
		return
	}
	switch d.GetAuditEvent() {
	case tetherv1.AuditEvent_AUDIT_EVENT_ACKED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED:
	default:
		return
	}
	until := sentAt.Add(j.leaseDuration(l))
	j.mu.Lock()
	defer j.mu.Unlock()
	if !until.After(j.heldUntil) {
		return
	}
	j.heldUntil = until
	if _, wall := j.w.cfg.Clock.(wallClock); wall && j.ctx.Err() == nil {
		if j.heldTimer == nil {
			j.heldTimer = time.AfterFunc(time.Until(until), func() { j.checkHeld() })
		} else {
			j.heldTimer.Reset(time.Until(until))
		}
	}
}

// leaseDuration is the lease duration l names, never longer than the
// generation's (the offer's, or the ACK answer's when the offer named
// none).
func (j *Job) leaseDuration(l *tetherv1.Lease) time.Duration {
	d := l.GetLeaseDuration().AsDuration()
	if j.duration > 0 && d > j.duration {
		return j.duration
	}
	return d
}

// checkHeld ends the job (ErrLeaseUnconfirmed) once the worker's clock
// reached the bound of the authority it can prove, and reports whether
// it did.
func (j *Job) checkHeld() bool {
	j.mu.Lock()
	until := j.heldUntil
	j.mu.Unlock()
	if until.IsZero() || j.w.heldNow().Before(until) {
		return false
	}
	j.end(ErrLeaseUnconfirmed)
	return true
}

// cancelling reports whether the job is running its OnCancel.
func (j *Job) cancelling() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.inOnCancel
}

// Context ends when the job must stop; context.Cause says why.
func (j *Job) Context() context.Context { return j.ctx }

// Done is closed when the renew loop has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Lease returns the lease as the coordinator last answered it.
func (j *Job) Lease() *tetherv1.Lease {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lease
}

// Header sets the fencing headers a Fence middleware checks: the job and
// the generation this Job accepted.
func (j *Job) Header(h http.Header) {
	h.Set(HeaderJobID, j.jobID)
	h.Set(HeaderLeaseGeneration, strconv.FormatUint(j.generation, 10))
}

// Stop ends the renew loop without a message (the lease runs out on the
// coordinator's clock).
func (j *Job) Stop() { j.end(ErrJobEnded) }

func (j *Job) end(cause error) {
	j.once.Do(func() {
		j.cancel(cause)
		close(j.stop)
		j.halt()
		j.mu.Lock()
		if j.heldTimer != nil {
			j.heldTimer.Stop()
		}
		j.mu.Unlock()
	})
}

func (j *Job) claim() (job, leaseID string, generation uint64, sent *timestamppb.Timestamp) {
	return j.jobID, j.leaseID, j.generation, timestamppb.New(j.w.cfg.Clock.Now())
}

func (j *Job) renewLoop() {
	defer close(j.done)
	defer j.w.untrack(j)
	every := j.w.cfg.RenewEvery
	if every <= 0 {
		d := j.leaseDuration(j.Lease())
		if d <= 0 {
			d = j.duration
		}
		every = max(d/3, 10*time.Millisecond)
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-ticker.C:
		}
		if j.checkHeld() {
			// Past the last accepted renewal's window on the worker's
			// clock: no renewal sent now could prove the time between.
			return
		}
		ctx, cancel := context.WithTimeout(j.halted, every)
		_, err := j.Renew(ctx)
		cancel()
		if endsRun(err) {
			// The control plane refuses the agent itself, not this lease
			// (whose refusals are decisions): its node's exit was
			// confirmed (failed_precondition: a launcher's attestation
			// while it was cut off), or its credential is dead
			// (unauthenticated, permission_denied: the node was
			// terminated), the refusals Agent.Run aborts on. Each renewal
			// is kept as evidence against that exit, and none will be
			// accepted: the job's work is told to stop now, not when its
			// window lapses on the worker's clock. A worker whose path
			// withheld its lease traffic while its node was stopped (the
			// stop's cancel request never reached the job) worked on for
			// the lease's whole window, up to the policy's ten minutes,
			// after its stop's record was written (rogue43l test).
			j.w.cfg.Log.Warn("lease renew refused: the agent may not act; the job ends", "job", j.Lease().GetJobId(), "error", err)
			j.end(fmt.Errorf("%w: the control plane refuses the agent's renewal: %w", ErrJobEnded, err))
			return
		}
		if err != nil && !retryable(err) {
			j.w.cfg.Log.Warn("lease renew refused", "job", j.Lease().GetJobId(), "error", err)
		}
	}
}

// Renew renews the lease once (the renew loop calls it on schedule) and
// acts on the answer: a cancel request cancels the job's context, runs
// OnCancel and acknowledges; an answer saying the generation has no
// authority ends the job. Expiry is only ever learnt from the coordinator;
// an accepted renewal also moves the bound of what the job can prove on
// the worker's clock (its send time plus the lease duration).
func (j *Job) Renew(ctx context.Context) (*tetherv1.Decision, error) {
	seq := j.next(&j.renewSeq)
	sentAt := j.w.heldNow()
	job, leaseID, gen, sent := j.claim()
	l, d, err := j.w.send(ctx, &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{
		JobId: job, LeaseId: leaseID, LeaseGeneration: gen, RenewSequence: seq, SentAt: sent,
	}}})
	if err != nil {
		return nil, err
	}
	j.held(sentAt, l, d)
	j.observe(ctx, l, gen, d)
	return d, nil
}

// next advances one of the job's sequences and returns its new value.
func (j *Job) next(seq *uint64) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	*seq++
	return *seq
}

// observe updates the job from a coordinator answer.
func (j *Job) observe(ctx context.Context, l *tetherv1.Lease, generation uint64, d *tetherv1.Decision) {
	if l == nil {
		return
	}
	if another := namesAnother(l, j.jobID, j.leaseID); another != "" {
		// Not this job's answer (a path that replays, caches or crosses
		// answers): generations count per job (every job's first is 1), so
		// another job's of the same generation passed for this one's, its
		// accepted renewal moving the job's bound and its cancel request
		// run (OnCancel) and acknowledged as the job's own. Nothing in it
		// is taken (not its lease, its cancel, its conflict, its window),
		// and the job, whose own answer never came, ends.
		j.w.cfg.Log.Warn("lease answer names another job or lease; the job ends", "job", j.jobID, "reason", another)
		j.end(fmt.Errorf("%w: %s", ErrLeaseLost, another))
		return
	}
	if l.OwnershipConflict && l.LeaseGeneration == generation || d.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT {
		// Another identity claims this generation: whatever else the
		// answer says, the work must not go on as if it were ours.
		j.mu.Lock()
		j.lease = l
		j.mu.Unlock()
		j.end(&OwnershipConflictError{JobID: l.JobId, LeaseID: l.LeaseId, Generation: generation, Reason: d.GetReason()})
		return
	}
	j.mu.Lock()
	j.lease = l
	firstCancel := l.CancelRequested && !j.cancelSeen
	if firstCancel {
		j.cancelSeen = true
	}
	j.mu.Unlock()
	lost := l.LeaseGeneration != generation || l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE
	if firstCancel {
		j.cancel(ErrLeaseCancelled)
		if j.opts.OnCancel != nil {
			j.mu.Lock()
			j.inOnCancel = true
			j.mu.Unlock()
			j.opts.OnCancel(l)
			j.mu.Lock()
			j.inOnCancel = false
			j.mu.Unlock()
		}
		if !l.CancelAck && !lost {
			job, leaseID, gen, sent := j.claim()
			_, _, err := j.w.deliver(ctx, &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_CancelAck{CancelAck: &tetherv1.LeaseServiceCancelAckRequest{
				JobId: job, LeaseId: leaseID, LeaseGeneration: gen, SentAt: sent,
			}}})
			if err != nil && !errors.Is(err, ErrSpooled) && !errors.Is(err, ErrWorkerClosed) {
				j.w.cfg.Log.Warn("lease cancel ack failed", "job", job, "error", err)
			}
		}
		// Renewals are refused once cancellation is requested: stop asking.
		j.end(ErrLeaseCancelled)
	}
	if lost {
		j.end(ErrLeaseLost)
	}
}

// Progress reports progress with the next sequence. When the control plane
// is unreachable it returns ErrSpooled: the report is on disk and will be
// replayed with its sequence and sent_at.
func (j *Job) Progress(ctx context.Context, value string) (*tetherv1.Decision, error) {
	seq := j.next(&j.progressSeq)
	job, leaseID, gen, sent := j.claim()
	l, d, err := j.w.deliver(ctx, &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{
		JobId: job, LeaseId: leaseID, LeaseGeneration: gen, ProgressSequence: seq, ProgressValue: value, SentAt: sent,
	}}})
	if err != nil {
		return nil, err
	}
	j.observe(ctx, l, gen, d)
	return d, nil
}

// Complete reports the terminal result (SUCCESS, FAILED or CANCELLED) and
// ends the job. It may return ErrSpooled, like Progress; a spooled result
// is judged when replayed, against the lease as it then is.
func (j *Job) Complete(ctx context.Context, result tetherv1.TerminalResult, detail string) (*tetherv1.Decision, error) {
	defer j.end(ErrJobEnded)
	job, leaseID, gen, sent := j.claim()
	l, d, err := j.w.deliver(ctx, &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Complete{Complete: &tetherv1.CompleteRequest{
		JobId: job, LeaseId: leaseID, LeaseGeneration: gen, Result: result, Detail: detail, SentAt: sent,
	}}})
	if err != nil {
		return nil, err
	}
	if l != nil && namesAnother(l, j.jobID, j.leaseID) == "" {
		j.mu.Lock()
		j.lease = l
		j.mu.Unlock()
	}
	return d, nil
}

// namesAnother says why an answer's lease is not the job's own (it names
// another job, or another lease of the job), or "" when it is. The ids
// are quoted clipped: the answer's are the path's to choose, and the
// reason is kept (the job's cause) and logged.
func namesAnother(l *tetherv1.Lease, jobID, leaseID string) string {
	if l.GetJobId() == jobID && l.GetLeaseId() == leaseID {
		return ""
	}
	what := "job " + clipped(l.GetJobId())
	if l.GetJobId() == jobID {
		what = "lease " + clipped(l.GetLeaseId())
	}
	return fmt.Sprintf("the answer names %s, not the job's lease %s: it is not this job's answer, and its own never came", what, clipped(leaseID))
}

// clipped is s quoted, at most 64 of its bytes.
func clipped(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
}

// spool is an append-only log of undelivered lease messages: one JSON line
// per message ({"id":n,"request":…}) and one per delivery ({"done":n}),
// each synced before the call returns. Opening it replays the log; a torn
// last line (a crash mid-append) is ignored. When nothing is pending the
// file is truncated.
type spool struct {
	mu      sync.Mutex
	f       *os.File
	nextID  uint64
	pending []spoolEntry
}

type spoolEntry struct {
	id  uint64
	req *tetherv1.ChannelRequest
}

type spoolLine struct {
	ID      uint64          `json:"id,omitempty"`
	Request json.RawMessage `json:"request,omitempty"`
	Done    uint64          `json:"done,omitempty"`
}

func openSpool(path string) (*spool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("agentsdk: spool: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agentsdk: spool: %w", err)
	}
	s := &spool{f: f, nextID: 1}
	data, err := os.ReadFile(path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("agentsdk: spool: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var line spoolLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			continue // a torn append
		}
		switch {
		case line.Done != 0:
			for i, e := range s.pending {
				if e.id == line.Done {
					s.pending = append(s.pending[:i], s.pending[i+1:]...)
					break
				}
			}
		case line.ID != 0:
			req := &tetherv1.ChannelRequest{}
			if err := protojson.Unmarshal(line.Request, req); err != nil {
				continue
			}
			s.pending = append(s.pending, spoolEntry{id: line.ID, req: req})
			s.nextID = max(s.nextID, line.ID+1)
		}
	}
	if len(s.pending) == 0 {
		if err := s.truncate(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *spool) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

func (s *spool) first() (spoolEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return spoolEntry{}, false
	}
	return s.pending[0], true
}

func (s *spool) writeLine(line spoolLine) error {
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("agentsdk: spool: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("agentsdk: spool: %w", err)
	}
	return nil
}

func (s *spool) append(req *tetherv1.ChannelRequest) error {
	body, err := protojson.Marshal(req)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	if err := s.writeLine(spoolLine{ID: id, Request: body}); err != nil {
		return err
	}
	s.nextID++
	s.pending = append(s.pending, spoolEntry{id: id, req: req})
	return nil
}

func (s *spool) done(id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) > 0 && s.pending[0].id == id {
		s.pending = s.pending[1:]
	}
	if len(s.pending) == 0 {
		return s.truncate()
	}
	return s.writeLine(spoolLine{Done: id})
}

func (s *spool) truncate() error {
	if err := s.f.Truncate(0); err != nil {
		return fmt.Errorf("agentsdk: spool: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("agentsdk: spool: %w", err)
	}
	return nil
}

func (s *spool) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.Close()
}
