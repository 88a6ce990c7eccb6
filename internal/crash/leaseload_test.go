package crash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

const (
	leaseSlots = 6 // jobs in progress at once, each with a holder and a coordinator client
	leaseTeam  = 3 // workers per team

	// Leases outlive the test and ACK deadlines outlive any restart, so
	// the coordinator's clock ends a generation only if a job stalls.
	leaseDuration = 10 * time.Minute
	ackTimeout    = 5 * time.Minute
)

// leaseLoad drives jobs through their lifecycle: per slot, a holder
// client (ack, renew, progress, duplicates, stale messages, cancel ack,
// complete — unary or over the Channel stream) and a coordinator client
// (offer, reads, cancel requests, reassignments, resolutions) race on the
// same job. Every call and its answer go into the history.
type leaseLoad struct {
	h    *harness
	rec  recorder
	mu   sync.Mutex
	team *team
	// byNode finds a holder's credential from the lease it holds.
	byNode map[string]*worker
	slots  []*job
	jobs   []*job
	next   int
}

type team struct {
	workers []*worker
	expires time.Time
}

type worker struct {
	id string
	c  *testserver.Clients
}

func newLeaseLoad(h *harness) *leaseLoad {
	l := &leaseLoad{h: h, byNode: map[string]*worker{}}
	l.prepare()
	l.slots = make([]*job, leaseSlots)
	for i := range l.slots {
		l.slots[i] = l.newJob()
	}
	return l
}

// prepare runs on the test goroutine before each round: it registers a
// new team of workers when the current one's credentials get old (agent
// credentials expire; the workload does not keep sessions to refresh them).
func (l *leaseLoad) prepare() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.team != nil && time.Until(l.team.expires) > 5*time.Minute {
		return
	}
	ctx := context.Background()
	root, err := l.h.admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "lease-team"}))
	if err != nil {
		l.h.t.Fatalf("register the lease team: %v", err)
	}
	l.h.nodes.add(root.Msg.Node.NodeId, "lease-team")
	t := &team{expires: root.Msg.CredentialExpiresAt.AsTime()}
	parent := l.h.clients(root.Msg.Credential)
	for i := range leaseTeam {
		name := fmt.Sprintf("lease-worker-%d", i)
		child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: name}))
		if err != nil {
			l.h.t.Fatalf("spawn %s: %v", name, err)
		}
		l.h.nodes.add(child.Msg.Node.NodeId, name)
		w := &worker{id: child.Msg.Node.NodeId, c: l.h.clients(child.Msg.Credential)}
		t.workers = append(t.workers, w)
		l.byNode[w.id] = w
		if exp := child.Msg.CredentialExpiresAt.AsTime(); exp.Before(t.expires) {
			t.expires = exp
		}
	}
	l.team = t
}

func (l *leaseLoad) worker(node string) *worker {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byNode[node]
}

func (l *leaseLoad) newJob() *job {
	l.mu.Lock()
	l.next++
	j := &job{id: fmt.Sprintf("crash-job-%d", l.next), team: l.team, changed: make(chan struct{})}
	l.jobs = append(l.jobs, j)
	l.mu.Unlock()
	return j
}

func (l *leaseLoad) slot(i int) *job {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.slots[i]
}

// advance replaces a finished job with a new one.
func (l *leaseLoad) advance(i int, done *job) {
	next := l.newJob()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slots[i] == done {
		l.slots[i] = next
	}
}

// job is the clients' view of one job: the newest lease any answer showed
// and the sequences sent for its generation. It is an input to the
// workload only; the model decides what is right.
type job struct {
	id   string
	team *team

	mu           sync.Mutex
	offered      bool
	known        *tetherv1.Lease
	changed      chan struct{}
	gen          uint64 // generation the counters below are for
	renew        uint64
	progress     uint64
	staleLease   string // an earlier generation's lease id
	staleGen     uint64
	holderSteps  int
	cancelWaited int
	notFound     bool // a read answered that the job has no lease
	// terminalReads counts the reads after restarts that found the job
	// terminal; after a few, later restarts read it only now and then.
	terminalReads int
}

// readNotFound reports (and forgets) whether a read found no lease.
func (j *job) readNotFound() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	nf := j.notFound
	j.notFound = false
	return nf
}

// observe takes an answer's lease into the clients' view.
func (j *job) observe(l *tetherv1.Lease) {
	if l == nil || l.LeaseGeneration == 0 || l.HolderIdentity == "" {
		// No lease, or the answer to a former holder, which withholds the
		// lease that replaced its own: the coordinator's reads tell more.
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.known != nil && l.LeaseGeneration < j.known.LeaseGeneration {
		return
	}
	if j.known != nil && l.LeaseGeneration > j.known.LeaseGeneration {
		j.staleLease, j.staleGen = j.known.LeaseId, j.known.LeaseGeneration
	}
	j.known = l
	if l.LeaseGeneration != j.gen {
		j.gen, j.renew, j.progress, j.holderSteps = l.LeaseGeneration, 0, 0, 0
	}
	close(j.changed)
	j.changed = make(chan struct{})
}

func (j *job) snapshot() (*tetherv1.Lease, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.known, j.changed
}

// pause waits for the job to change, a short pacing delay, or stop.
func pause(rng *rand.Rand, changed <-chan struct{}, stop <-chan struct{}) {
	t := time.NewTimer(time.Duration(1+rng.IntN(8)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-stop:
	}
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

func (l *leaseLoad) run(wg *sync.WaitGroup, stop <-chan struct{}, seed uint64) {
	l.prepare()
	for i := range leaseSlots {
		wg.Add(2)
		holderRNG := rand.New(rand.NewPCG(seed, uint64(2*i)))
		coordRNG := rand.New(rand.NewPCG(seed, uint64(2*i+1)))
		go func() { defer wg.Done(); l.holder(i, holderRNG, stop) }()
		go func() { defer wg.Done(); l.coordinator(i, coordRNG, stop) }()
	}
}

// holder speaks for whichever worker holds the slot's job.
func (l *leaseLoad) holder(slot int, rng *rand.Rand, stop <-chan struct{}) {
	streams := map[string]*channelSender{}
	defer func() {
		for _, s := range streams {
			s.close()
		}
	}()
	useChannel := rng.IntN(2) == 0
	for !stopped(stop) {
		j := l.slot(slot)
		lease, changed := j.snapshot()
		if lease == nil || (lease.State != tetherv1.LeaseState_LEASE_STATE_OFFERED && lease.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE) {
			pause(rng, changed, stop)
			continue
		}
		w := l.worker(lease.HolderIdentity)
		in, ok := j.nextHolderMessage(lease, rng)
		if !ok || w == nil {
			pause(rng, changed, stop)
			continue
		}
		in.Job, in.Holder = j.id, w.id
		var send func(ctx context.Context, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error)
		if useChannel {
			s := streams[w.id]
			if s == nil {
				s = &channelSender{c: w.c}
				streams[w.id] = s
			}
			send = s.send
		} else {
			send = func(ctx context.Context, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
				return unaryWorker(ctx, w.c, in)
			}
		}
		if !l.apply(j, 1+2*slot, in, send) {
			backoff(stop) // the server is probably gone: do not spin
		}
	}
}

// backoff waits a little before the next call after one got no answer.
func backoff(stop <-chan struct{}) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// nextHolderMessage chooses the holder's next message: mostly advancing
// renews and progress, sometimes a duplicate or a stale generation's
// message, and a terminal result after a while.
func (j *job) nextHolderMessage(l *tetherv1.Lease, rng *rand.Rand) (LeaseInput, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	in := LeaseInput{LeaseID: l.LeaseId, Generation: l.LeaseGeneration}
	if l.State == tetherv1.LeaseState_LEASE_STATE_OFFERED {
		if l.CancelRequested {
			return in, false // an ACK would be refused; the coordinator resolves
		}
		in.Op = OpAck
		return in, true
	}
	j.holderSteps++
	switch {
	case l.CancelRequested && !l.CancelAck:
		in.Op = OpCancelAck
		return in, true
	case l.CancelRequested:
		in.Op, in.Result = OpComplete, cancelled
		return in, true
	}
	r := rng.IntN(100)
	switch {
	case r < 8 && j.renew > 0:
		in.Op, in.Sequence = OpRenew, j.renew // a duplicated renew
	case r < 14 && j.progress > 0:
		in.Op, in.Sequence, in.Value = OpProgress, j.progress, progressValue(j.progress) // a duplicated frame
	case r < 18 && j.staleGen > 0:
		j.renew++
		in.Op, in.Sequence, in.LeaseID, in.Generation = OpRenew, j.renew, j.staleLease, j.staleGen // an old generation's renew
	case r < 24 && j.holderSteps > 12:
		in.Op, in.Result = OpComplete, success
		if rng.IntN(4) == 0 {
			in.Result = tetherv1.TerminalResult_TERMINAL_RESULT_FAILED
		}
	case r < 60:
		j.renew++
		in.Op, in.Sequence = OpRenew, j.renew
	default:
		j.progress++
		in.Op, in.Sequence, in.Value = OpProgress, j.progress, progressValue(j.progress)
	}
	return in, true
}

func progressValue(seq uint64) string { return fmt.Sprintf("step-%d", seq) }

// coordinator offers the slot's job, reads it, and now and then cancels,
// reassigns or resolves it; once it is terminal the slot gets a new job.
func (l *leaseLoad) coordinator(slot int, rng *rand.Rand, stop <-chan struct{}) {
	admin := l.h.admin
	for !stopped(stop) {
		j := l.slot(slot)
		lease, _ := j.snapshot()
		j.mu.Lock()
		offered := j.offered
		j.offered = true
		j.mu.Unlock()
		in := LeaseInput{Job: j.id}
		switch {
		case !offered:
			in.Op, in.Holder = OpOffer, j.team.workers[rng.IntN(len(j.team.workers))].id
		case lease == nil || rng.IntN(100) < 45:
			in.Op = OpGet
		case lease.State == tetherv1.LeaseState_LEASE_STATE_TERMINAL:
			l.advance(slot, j)
			continue
		case lease.State == tetherv1.LeaseState_LEASE_STATE_EXPIRED || lease.CancelRequested && j.waitedForCancel():
			if lease.CancelRequested || rng.IntN(2) == 0 {
				in.Op, in.Result = OpResolve, cancelled
				if !lease.CancelRequested {
					in.Result = tetherv1.TerminalResult_TERMINAL_RESULT_FAILED
				}
			} else {
				in.Op, in.Holder = OpReassign, j.team.workers[rng.IntN(len(j.team.workers))].id
			}
		case !lease.CancelRequested && rng.IntN(100) < 2:
			in.Op = OpRequestCancel
		case !lease.CancelRequested && rng.IntN(100) < 3:
			in.Op, in.Holder = OpReassign, j.team.workers[rng.IntN(len(j.team.workers))].id
		case rng.IntN(100) < 1:
			in.Op, in.Result = OpResolve, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED // the operator gives up on the job
		default:
			in.Op = OpGet
		}
		found := l.apply(j, 2*slot, in, func(ctx context.Context, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
			return unaryCoordinator(ctx, admin, in)
		})
		if !found && lease == nil && in.Op == OpGet && j.readNotFound() {
			// The Offer the kill cut off never happened: offer again.
			j.mu.Lock()
			j.offered = false
			j.mu.Unlock()
		}
		pace(rng, stop)
	}
}

// pace spaces the coordinator's calls out, so that the holders' traffic
// dominates, as it does in production.
func pace(rng *rand.Rand, stop <-chan struct{}) {
	t := time.NewTimer(time.Duration(5+rng.IntN(20)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// waitedForCancel gives the holder a few turns to answer a cancel request
// before the coordinator resolves the job itself.
func (j *job) waitedForCancel() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cancelWaited++
	return j.cancelWaited > 4
}

// apply sends one message, records it and its answer, and feeds the
// answer back into the clients' view.
// It reports false when the call got no answer or a read answered that
// the job has no lease.
func (l *leaseLoad) apply(j *job, client int, in LeaseInput, send func(context.Context, LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error)) (found bool) {
	h := l.h
	i := l.rec.begin(in, h.now(), client)
	var (
		lease    *tetherv1.Lease
		decision *tetherv1.Decision
	)
	answered, err := h.call(func(ctx context.Context) error {
		var err error
		lease, decision, err = send(ctx, in)
		return err
	})
	at := h.now()
	switch {
	case err == nil:
		out := LeaseOutput{Lease: ViewOf(lease)}
		if decision != nil {
			out.Outcome = decision.Outcome
		}
		l.rec.answer(i, out, at)
		j.observe(lease)
	case in.Op == OpGet && connect.CodeOf(err) == connect.CodeNotFound:
		l.rec.answer(i, LeaseOutput{}, at)
		j.mu.Lock()
		j.notFound = true
		j.mu.Unlock()
		return false
	case answered:
		// Refused before judgement: nothing happened. The workload sends
		// only well-formed messages from authorised callers, so this is a
		// finding unless the worker's credential died with its team.
		l.rec.drop(i)
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			h.t.Errorf("lease %s %s refused: %v", in.Op, in.Job, err)
		}
	case in.Op == OpGet:
		l.rec.drop(i) // a read without an answer says nothing
		return false
	default:
		l.rec.cutOff(i)
		return false
	}
	return true
}

// readAll reads the jobs' leases after a restart, into the history: the
// model checks that each shows every acknowledged decision. A job found
// terminal after three restarts is read again only one restart in five
// (a terminal lease never changes; reading it forever would make the
// history grow with the square of the kills).
func (l *leaseLoad) readAll(round int) {
	l.mu.Lock()
	jobs := append([]*job(nil), l.jobs...)
	l.mu.Unlock()
	for _, j := range jobs {
		j.mu.Lock()
		skip := j.terminalReads >= 3 && round%5 != 0
		j.mu.Unlock()
		if skip {
			continue
		}
		l.apply(j, 2*leaseSlots, LeaseInput{Op: OpGet, Job: j.id}, func(ctx context.Context, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
			lease, d, err := unaryCoordinator(ctx, l.h.admin, in)
			if err == nil && lease.GetState() == tetherv1.LeaseState_LEASE_STATE_TERMINAL {
				j.mu.Lock()
				j.terminalReads++
				j.mu.Unlock()
			}
			return lease, d, err
		})
		l.h.reads.Add(1)
	}
}

func unaryCoordinator(ctx context.Context, c *testserver.Clients, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
	switch in.Op {
	case OpOffer:
		r, err := c.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: in.Job, HolderIdentity: in.Holder,
			LeaseDuration: durationpb.New(leaseDuration), AckTimeout: durationpb.New(ackTimeout)}))
		return unpack(r, err)
	case OpReassign:
		r, err := c.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: in.Job, HolderIdentity: in.Holder,
			LeaseDuration: durationpb.New(leaseDuration), AckTimeout: durationpb.New(ackTimeout), Reason: "crash harness"}))
		return unpack(r, err)
	case OpRequestCancel:
		r, err := c.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: in.Job, Reason: "crash harness"}))
		return unpack(r, err)
	case OpResolve:
		r, err := c.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: in.Job, Result: in.Result, Reason: "crash harness"}))
		return unpack(r, err)
	case OpGet:
		r, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: in.Job}))
		if err != nil {
			return nil, nil, err
		}
		return r.Msg.Lease, nil, nil
	}
	return nil, nil, fmt.Errorf("not a coordinator operation: %s", in.Op)
}

type leaseAnswer interface {
	GetLease() *tetherv1.Lease
	GetDecision() *tetherv1.Decision
}

func unpack[R any, PR interface {
	*R
	leaseAnswer
}](r *connect.Response[R], err error) (*tetherv1.Lease, *tetherv1.Decision, error) {
	if err != nil {
		return nil, nil, err
	}
	msg := PR(r.Msg)
	return msg.GetLease(), msg.GetDecision(), nil
}

func unaryWorker(ctx context.Context, c *testserver.Clients, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
	switch in.Op {
	case OpAck:
		return unpack(c.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation})))
	case OpRenew:
		return unpack(c.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, RenewSequence: in.Sequence})))
	case OpProgress:
		return unpack(c.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, ProgressSequence: in.Sequence, ProgressValue: in.Value})))
	case OpCancelAck:
		return unpack(c.Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation})))
	case OpComplete:
		return unpack(c.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, Result: in.Result})))
	}
	return nil, nil, fmt.Errorf("not a worker message: %s", in.Op)
}

func channelRequest(in LeaseInput) *tetherv1.ChannelRequest {
	switch in.Op {
	case OpAck:
		return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Ack{Ack: &tetherv1.AckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation}}}
	case OpRenew:
		return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, RenewSequence: in.Sequence}}}
	case OpProgress:
		return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Progress{Progress: &tetherv1.ProgressRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, ProgressSequence: in.Sequence, ProgressValue: in.Value}}}
	case OpCancelAck:
		return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_CancelAck{CancelAck: &tetherv1.LeaseServiceCancelAckRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation}}}
	case OpComplete:
		return &tetherv1.ChannelRequest{Message: &tetherv1.ChannelRequest_Complete{Complete: &tetherv1.CompleteRequest{JobId: in.Job, LeaseId: in.LeaseID, LeaseGeneration: in.Generation, Result: in.Result}}}
	}
	return nil
}

// channelSender sends worker messages one at a time on a Channel stream,
// opening a new stream after the old one broke.
type channelSender struct {
	c           *testserver.Clients
	stream      *connect.BidiStreamForClient[tetherv1.ChannelRequest, tetherv1.ChannelResponse]
	cancel      context.CancelFunc
	correlation uint64
}

func (s *channelSender) close() {
	if s.stream != nil {
		s.cancel()
		_ = s.stream.CloseRequest()
		_ = s.stream.CloseResponse()
		s.stream = nil
	}
}

var errChannelAnswer = errors.New("channel answer")

func (s *channelSender) send(ctx context.Context, in LeaseInput) (*tetherv1.Lease, *tetherv1.Decision, error) {
	if s.stream == nil {
		// The stream outlives the call's context; the call's deadline
		// bounds the wait for the answer below.
		sctx, cancel := context.WithCancel(context.Background())
		s.stream, s.cancel = s.c.Lease.Channel(sctx), cancel
	}
	s.correlation++
	req := channelRequest(in)
	req.CorrelationId = s.correlation
	type answer struct {
		resp *tetherv1.ChannelResponse
		err  error
	}
	done := make(chan answer, 1)
	stream := s.stream
	go func() {
		if err := stream.Send(req); err != nil {
			// The stream's own error (a refusal, or why it broke) comes
			// with the receive side.
			if _, rerr := stream.Receive(); rerr != nil {
				err = rerr
			}
			done <- answer{err: err}
			return
		}
		resp, err := stream.Receive()
		done <- answer{resp, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		s.cancel() // unblocks the receive
		a = <-done
		if a.err == nil {
			a.err = ctx.Err()
		}
	}
	if a.err != nil {
		s.close()
		if refusal(a.err) {
			return nil, nil, a.err
		}
		return nil, nil, connect.NewError(connect.CodeUnavailable, a.err)
	}
	if a.resp.CorrelationId != req.CorrelationId {
		s.close()
		return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%w for %d arrived for %d", errChannelAnswer, a.resp.CorrelationId, req.CorrelationId))
	}
	if a.resp.Error != "" {
		// "code: message", from the server's judgement of this message.
		var code connect.Code
		for c := connect.CodeCanceled; c <= connect.CodeUnauthenticated; c++ {
			if len(a.resp.Error) > len(c.String()) && a.resp.Error[:len(c.String())+1] == c.String()+":" {
				code = c
			}
		}
		if code == 0 {
			code = connect.CodeUnknown
		}
		return nil, nil, connect.NewError(code, fmt.Errorf("%w: %s", errChannelAnswer, a.resp.Error))
	}
	return a.resp.Lease, a.resp.Decision, nil
}
