// Package mcptest is an MCP server written with the Go SDK, for the MCP
// gateway's tests, its benchmark and its demo: a real upstream whose tools
// report what happened to them (a call started, was cancelled) as events a
// test can wait on, in process or, for a server in another process, as
// files in a directory.
package mcptest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Events records what the upstream's slow calls went through, by the id
// the caller gave them.
type Events struct {
	// Dir, when set, also gets an empty file "<id>.started" and
	// "<id>.cancelled" for each event (for a server in another process).
	Dir string

	mu     sync.Mutex
	calls  map[string]*callEvents
	counts map[string]int
}

// Calls is how many calls of tool the upstream has received.
func (e *Events) Calls(tool string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[tool]
}

func (e *Events) count(tool string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[tool]++
}

type callEvents struct {
	started, cancelled, release chan struct{}
	startOnce, cancelOnce       sync.Once
	releaseOnce                 sync.Once
}

func (e *Events) get(id string) *callEvents {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.calls == nil {
		e.calls = map[string]*callEvents{}
	}
	c, ok := e.calls[id]
	if !ok {
		c = &callEvents{started: make(chan struct{}), cancelled: make(chan struct{}), release: make(chan struct{})}
		e.calls[id] = c
	}
	return c
}

// Started is closed when the slow call id has started.
func (e *Events) Started(id string) <-chan struct{} { return e.get(id).started }

// Cancelled is closed when the slow call id saw its request cancelled.
func (e *Events) Cancelled(id string) <-chan struct{} { return e.get(id).cancelled }

// Release lets the slow call id finish.
func (e *Events) Release(id string) {
	c := e.get(id)
	c.releaseOnce.Do(func() { close(c.release) })
}

func (e *Events) mark(id, what string) {
	if e.Dir != "" {
		_ = os.WriteFile(filepath.Join(e.Dir, filepath.Base(id)+"."+what), nil, 0o600)
	}
}

// EchoIn is the echo tool's input.
type EchoIn struct {
	Text string `json:"text" jsonschema:"the text to return"`
}

// SlowIn is the slow tool's input.
type SlowIn struct {
	ID string `json:"id" jsonschema:"names the call in the server's events"`
}

// NewServer returns the upstream. Its tools:
//
//   - echo {text}: returns text.
//   - slow {id}: reports progress 1 ("started"), then waits until the test
//     releases it (Events.Release) or its request is cancelled; returns
//     "finished <id>".
//   - fail: returns an isError result.
func NewServer(ev *Events) *mcp.Server {
	if ev == nil {
		ev = &Events{}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "tether-test-upstream", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "returns its text"}, func(_ context.Context, _ *mcp.CallToolRequest, in EchoIn) (*mcp.CallToolResult, any, error) {
		ev.count("echo")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "waits until released or cancelled"}, func(ctx context.Context, req *mcp.CallToolRequest, in SlowIn) (*mcp.CallToolResult, any, error) {
		ev.count("slow")
		c := ev.get(in.ID)
		if pt := req.Params.GetProgressToken(); pt != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: pt, Progress: 1, Total: 2, Message: "started " + in.ID})
		}
		ev.mark(in.ID, "started")
		c.startOnce.Do(func() { close(c.started) })
		select {
		case <-c.release:
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "finished " + in.ID}}}, nil, nil
		case <-ctx.Done():
			ev.mark(in.ID, "cancelled")
			c.cancelOnce.Do(func() { close(c.cancelled) })
			return nil, nil, ctx.Err()
		}
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "always fails"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		ev.count("fail")
		return nil, nil, fmt.Errorf("fail does what it says")
	})
	return s
}
