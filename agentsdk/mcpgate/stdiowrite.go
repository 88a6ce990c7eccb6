package mcpgate

import (
	"context"
	"log/slog"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/internal/orphans"
)

// stdioTransport is a stdio upstream's transport: the SDK's, whose writes
// its callers can abandon (abandonableWrites), its answers to the
// upstream's requests under bound (answerBound), and whose closing waits
// for the upstream's process in the background, in exits.
type stdioTransport struct {
	mcp.Transport
	cmd      *exec.Cmd // the upstream's process, a group's leader (ownGroup)
	bound    answerBound
	exits    *exits
	log      *slog.Logger
	upstream string // its name
}

func (t stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	// Started on a thread that lives as long as the process (diesWithGateway).
	c, err := startLocked(func() (mcp.Connection, error) { return t.Transport.Connect(ctx) })
	if err != nil {
		return nil, err
	}
	// Started, not yet waited for: /proc knows the process even if it
	// exited already.
	var left orphans.Watch
	if t.cmd.Process != nil {
		left = orphans.Start(t.cmd.Process.Pid)
		if err := left.Err(); err != nil {
			t.log.Warn("mcpgate: what a stdio upstream's process leaves outside its process group will not be stopped with it", "upstream", t.upstream, "error", err)
		}
	}
	return abandonableWrites{Connection: c, cmd: t.cmd, bound: t.bound, exits: t.exits, orphans: left, log: t.log, upstream: t.upstream, late: newLateAnswers()}, nil
}

// orphansGrace is how long the gateway goes on killing what a stdio
// upstream left outside its process group (orphans.Sweep) before it
// gives up and logs it: SIGKILL ends a process at once, and a sweep
// gives up only on one that does not end.
const orphansGrace = 5 * time.Second

// abandonedWriteGrace is how long a write whose context ended may still
// take before abandonableWrites ends the connection: writing a request of
// MaxForwardedParamsBytes to an upstream that reads takes milliseconds.
const abandonedWriteGrace = time.Second

// abandonableWrites ends the connection when a write is still under way
// abandonedWriteGrace after its context ended. The Go SDK writes a message to a stdio upstream
// without regard to the context: a call whose request did not fit in the
// pipe of an upstream that no longer reads its input stayed blocked in the
// write, and the control plane's cancel could not end it — the gateway
// never acknowledged the cancel, nor answered the agent. Ending the
// connection closes the upstream's input (the write returns, the rest of
// the message is never written, so the upstream never has the request
// whole) and stops the process; the gateway starts it again (watch), and
// the other calls in flight on it fail, as on any stdio upstream's exit.
// A write that completes before the connection ends was written whole:
// the call goes on as any the cancel overtook after its request was sent.
//
// The gateway's answer to the upstream's own request is written under
// bound: the SDK's client writes it under a context that never ends, and
// an upstream that asked and no longer read its input held the gateway's
// Close for ever.
//
// Its Close ends the upstream's input and returns: the SDK's waits for the
// process to exit (5 s, then 5 s more after SIGTERM, then SIGKILL) run in
// the background, counted in exits, for which the gateway's Close waits.
// The SDK closes the connection from within whichever of its calls ends
// last: a call the gateway abandoned as it closed waited there for the
// process of a rogue upstream that lingered, and the gateway's report of
// its end (and the reports after it) with it. Once the process is gone,
// what is left of its process group is killed (endGroup), before the
// closing is done: a process it started, which may be doing a call's
// work, went on after the upstream had exited at its input's end, when
// the gateway had recorded the calls abandoned ended. On Linux so is what
// left the group (a session of its own, setsid, as a daemon does, or a
// double fork), which the gateway's process adopted as a child subreaper
// (orphans): every orphan it adopted that started since the upstream's
// process did, with everything below it.
type abandonableWrites struct {
	mcp.Connection
	cmd      *exec.Cmd
	bound    answerBound
	exits    *exits
	orphans  orphans.Watch
	log      *slog.Logger
	upstream string
	late     *lateAnswers // the calls whose answers the gateway listens for (ranOnPastCancel)
}

// Read hands each answer read to the call that listens for it (lateAnswers).
func (c abandonableWrites) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		c.late.end()
		return msg, err
	}
	c.late.read(msg)
	return msg, nil
}

func (c abandonableWrites) Close() error {
	c.late.end()
	done := c.exits.add()
	go func() {
		defer done()
		_ = c.Connection.Close()
		if c.cmd != nil {
			endGroup(c.cmd)
		}
		if err := orphans.Sweep(c.orphans, time.Now().Add(orphansGrace)); err != nil && c.orphans.Err() == nil {
			c.log.Warn("mcpgate: what a stdio upstream's process left behind is not proven gone", "upstream", c.upstream, "error", err)
		}
	}()
	return nil
}

// exits are the closings of stdio upstreams' connections under way, each
// waiting for its upstream's process to exit. Not a sync.WaitGroup: a
// connection may be closed (its write abandoned) as the gateway's Close
// waits.
type exits struct {
	mu      sync.Mutex
	pending map[chan struct{}]struct{}
}

// add counts one closing until done is called.
func (e *exits) add() (done func()) {
	ch := make(chan struct{})
	e.mu.Lock()
	if e.pending == nil {
		e.pending = map[chan struct{}]struct{}{}
	}
	e.pending[ch] = struct{}{}
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		delete(e.pending, ch)
		e.mu.Unlock()
		close(ch)
	}
}

// wait returns once no closing is under way.
func (e *exits) wait() {
	for {
		e.mu.Lock()
		var ch chan struct{}
		for ch = range e.pending {
			break
		}
		e.mu.Unlock()
		if ch == nil {
			return
		}
		<-ch
	}
}

func (c abandonableWrites) Write(ctx context.Context, msg jsonrpc.Message) error {
	if _, answer := msg.(*jsonrpc.Response); answer {
		if !c.bound.held.take() {
			return nil // not written (MaxAnswersInFlight)
		}
		defer c.bound.held.release()
		var done func()
		ctx, done = c.bound.bind(ctx)
		defer done()
	}
	if err := ctx.Err(); err != nil {
		return err // not written at all (the SDK's own rule)
	}
	c.late.written(ctx, msg)
	done := make(chan error, 1)
	go func() { done <- c.Connection.Write(ctx, msg) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// A write that was about to end (an upstream that reads) is let end:
	// an honest upstream is not restarted, and its other calls not failed,
	// for a cancel that came as it took the request.
	grace := time.NewTimer(abandonedWriteGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err
	case <-grace.C:
	}
	// Close closes the input first, which ends the write, then waits for
	// the process to exit (signalling it if it does not): not on this path.
	_ = c.Close()
	if err := <-done; err != nil {
		return ctx.Err()
	}
	return nil
}
