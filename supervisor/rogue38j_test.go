package supervisor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/store/badgerstore"
)

// rogue38jSink refuses every record while it is shut, telling the test of
// each attempt and waiting for its word before it answers; open, it takes
// each record and tells the test.
type rogue38jSink struct {
	mu        sync.Mutex
	open      bool
	attempts  chan string
	answer    chan error
	delivered chan string
}

func (k *rogue38jSink) Deliver(_ context.Context, recordID string, _ []byte) error {
	k.mu.Lock()
	open := k.open
	k.mu.Unlock()
	if open {
		k.delivered <- recordID
		return nil
	}
	k.attempts <- recordID
	return <-k.answer
}

// TestRogue38JOwnChildrensRecordsDoNotDelayAnOperatorsRecord: a rogue
// stops its own children one at a time, each stop a termination of its
// own with a record for the sink; an operator then stops an agent of
// another tree. The sink was down meanwhile, and every record waits for
// its retry. Until the thirty-eighth pass the record outbox served the
// records due at once in the order they came due, one group for all: the
// operator's record reached the sink (the audit trail outside the
// workload) only after every one of the rogue's, as many as the rogue
// cared to make. Now the outbox serves them a tree at a time in turn, an
// operator's stops a turn of their own, as the termination reconciler
// does: the operator's record is delivered second.
func TestRogue38JOwnChildrensRecordsDoNotDelayAnOperatorsRecord(t *testing.T) {
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := s.Clock.(interface {
		Now() time.Time
		Advance(time.Duration)
	})
	sink := &rogue38jSink{attempts: make(chan string), answer: make(chan error), delivered: make(chan string, 64)}
	s.Sink = sink
	o := &Outbox{Supervisor: s, Render: func(r *ReconciliationRecord) ([]byte, error) { return []byte(r.RecordID), nil },
		Retry: time.Hour, MaxRetry: time.Hour}
	ran := make(chan error, 1)
	go func() { ran <- o.Run(ctx) }()
	defer func() {
		cancel()
		<-ran
	}()

	// stop terminates a node, runs it to its record, and answers the
	// record's first delivery with answer, the clock a second later than
	// the previous one's: the records that fail come due for their retry
	// in this order (the outbox has one worker: a record is offered only
	// once the previous one's retry is set).
	stop := func(req TerminateRequest, answer error) string {
		t.Helper()
		req.Mode, req.Reason, req.CancelAckTimeout, req.ConfirmTimeout = ModeAbort, "rogue38j", time.Second, time.Second
		term, err := s.Terminate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		term = reconcileUntilTerminated(t, s, term.ID, 100, func() { clk.Advance(time.Second) })
		if got := <-sink.attempts; got != term.RecordID {
			t.Fatalf("the sink was offered %s, want %s", got, term.RecordID)
		}
		clk.Advance(time.Second)
		sink.answer <- answer
		return term.RecordID
	}

	rogue, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	const children = 6
	down := errors.New("rogue38j: the sink is down")
	var rogues []string
	for range children {
		c, err := s.Tree.Spawn(ctx, rogue.NodeID, "child", nil, "agent:"+rogue.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		rogues = append(rogues, stop(TerminateRequest{NodeID: c.NodeID, RequestedBy: "agent:" + rogue.NodeID, RequesterNodeID: rogue.NodeID}, down))
	}
	other, err := s.Tree.RegisterRoot(ctx, "other", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	victim, err := s.Tree.Spawn(ctx, other.NodeID, "worker", nil, "agent:"+other.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	operators := stop(TerminateRequest{NodeID: victim.NodeID, RequestedBy: "operator:test"}, down)
	// One more of the rogue's, taken at once: once it is offered, the
	// operator's record's retry is set (before the clock moves on).
	last, err := s.Tree.Spawn(ctx, rogue.NodeID, "child", nil, "agent:"+rogue.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop(TerminateRequest{NodeID: last.NodeID, RequestedBy: "agent:" + rogue.NodeID, RequesterNodeID: rogue.NodeID}, nil)

	// The sink is back; every record comes due for its retry at once.
	sink.mu.Lock()
	sink.open = true
	sink.mu.Unlock()
	clk.Advance(2 * time.Hour)
	var order []string
	for range children + 1 {
		order = append(order, <-sink.delivered)
	}
	at := slices.Index(order, operators)
	if at < 0 {
		t.Fatalf("the operator's record %s was not delivered: %v", operators, order)
	}
	if at > 1 {
		t.Fatalf("the operator's record was delivered after %d of the rogue's %d own children's records (%v): the rogue's stops of its own children delay the operator's record", at, children, rogues)
	}
}

// TestRogue38JRecordsPendingAtARestartTakeTurnsToo: the same records, all
// undelivered when the outbox starts (a restart, a new leader): the scan
// reads each one's group from its entry, and the operator's record is
// among the first two delivered whatever the order of their ids.
func TestRogue38JRecordsPendingAtARestartTakeTurnsToo(t *testing.T) {
	s, _ := chunkTestSupervisor(t, badgerstore.BadgerOptions{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := s.Clock.(interface {
		Now() time.Time
		Advance(time.Duration)
	})
	stop := func(req TerminateRequest) string {
		t.Helper()
		req.Mode, req.Reason, req.CancelAckTimeout, req.ConfirmTimeout = ModeAbort, "rogue38j", time.Second, time.Second
		term, err := s.Terminate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return reconcileUntilTerminated(t, s, term.ID, 100, func() { clk.Advance(time.Second) }).RecordID
	}
	rogue, err := s.Tree.RegisterRoot(ctx, "rogue", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	const children = 6
	for range children {
		c, err := s.Tree.Spawn(ctx, rogue.NodeID, "child", nil, "agent:"+rogue.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop(TerminateRequest{NodeID: c.NodeID, RequestedBy: "agent:" + rogue.NodeID, RequesterNodeID: rogue.NodeID})
	}
	other, err := s.Tree.RegisterRoot(ctx, "other", nil, "operator:test")
	if err != nil {
		t.Fatal(err)
	}
	victim, err := s.Tree.Spawn(ctx, other.NodeID, "worker", nil, "agent:"+other.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	operators := stop(TerminateRequest{NodeID: victim.NodeID, RequestedBy: "operator:test"})

	sink := &rogue38jSink{open: true, delivered: make(chan string, 64)}
	s.Sink = sink
	o := &Outbox{Supervisor: s, Render: func(r *ReconciliationRecord) ([]byte, error) { return []byte(r.RecordID), nil }}
	ran := make(chan error, 1)
	go func() { ran <- o.Run(ctx) }()
	defer func() {
		cancel()
		<-ran
	}()
	var order []string
	for range children + 1 {
		order = append(order, <-sink.delivered)
	}
	if at := slices.Index(order, operators); at < 0 || at > 1 {
		t.Fatalf("the operator's record %s was delivered at %d of %v: the scan put it behind the rogue's own children's records", operators, at, order)
	}
}
