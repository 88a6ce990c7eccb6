package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TokenSource gives the stdio wrapper the agent's current capability token.
type TokenSource interface {
	Token() (string, error)
}

// StaticToken is a token that never changes (from the environment).
type StaticToken string

// Token returns the token.
func (s StaticToken) Token() (string, error) {
	if s == "" {
		return "", errors.New("the capability token is empty")
	}
	return string(s), nil
}

// FileToken reads the token from a file and reads it again whenever the
// file changes (size or modification time), so that whoever refreshes the
// agent's token (its launcher, its SDK) only has to rewrite the file.
type FileToken struct {
	Path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	token   string
}

// Token returns the file's current token.
func (f *FileToken) Token() (string, error) {
	st, err := os.Stat(f.Path)
	if err != nil {
		return "", fmt.Errorf("capability token file: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.token != "" && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return f.token, nil
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("capability token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("capability token file %s is empty", f.Path)
	}
	f.token, f.modTime, f.size = t, st.ModTime(), st.Size()
	return t, nil
}

// ServeStdio serves one agent over r and w (a framework's stdio MCP
// client) until the agent hangs up or ctx ends, with the agent's token from
// tokens. Call it once per gateway. A session whose close the agent holds
// up (it does not read w) is given up after the write-stall timeout, and
// w closed.
func (g *Gateway) ServeStdio(ctx context.Context, tokens TokenSource, r io.ReadCloser, w io.WriteCloser) error {
	if !g.stdioToken.CompareAndSwap(nil, &tokens) {
		return errors.New("mcpgate: ServeStdio serves one agent per gateway")
	}
	// The gateway's Close ends the session as ctx's end does: a closed
	// gateway reports nothing to the control plane, and the session served
	// on (ping, tools/list) was the agent answered unseen.
	ctx, closing := context.WithCancel(ctx)
	defer closing()
	go func() {
		select {
		case <-g.closed:
			closing()
		case <-ctx.Done():
		}
	}()
	// The end of ctx is the gateway's shutdown (`tether mcp wrap` stopped):
	// the calls in flight, which the agent's leaving does not end, are
	// abandoned, or Run would wait for their upstream's answers.
	stop := context.AfterFunc(ctx, func() { g.abandonCalls(errGatewayClosing) })
	defer stop()
	st := &stdioSession{conn: &stdioConn{}, gone: make(chan struct{}), connected: make(chan struct{}), done: make(chan struct{}), abandoned: make(chan struct{})}
	r, w = refuseStdioBatches(r, w, func() (string, func()) {
		// As the middleware does for any request of the agent's.
		token, err := g.stdioRevoked(ctx)
		if err == nil {
			g.noteSeen(ctx, token)
			return "", nil
		}
		g.noteRefused(ctx, token, err)
		end := func() { g.endStdio(st, err) }
		line, merr := json.Marshal(struct {
			JSONRPC string         `json:"jsonrpc"`
			ID      any            `json:"id"`
			Error   *jsonrpc.Error `json:"error"`
		}{"2.0", nil, verifierRefusal(err)})
		if merr != nil {
			end()
			return "", nil
		}
		return string(line) + "\n", end
	})
	st.conn.seen = func(ctx context.Context) {
		// An answer to a request no one told the control plane of.
		token, err := g.stdioRevoked(ctx)
		if err != nil {
			g.noteRefused(ctx, token, err)
			return
		}
		g.noteSeen(ctx, token)
	}
	defer close(st.done)
	g.stdio.Store(st)
	ss, err := g.server.Connect(ctx, agentStdio{Transport: &mcp.IOTransport{Reader: r, Writer: w}, conn: st.conn}, nil)
	st.ss = ss
	close(st.connected)
	if err != nil {
		return err
	}
	// A token revoked before the session began ends it now; later ones as
	// the verifier applies them (endRevokedSessions), or as a request finds
	// them (middleware).
	g.checkStdio()
	waited := make(chan error, 1)
	go func() { waited <- ss.Wait() }()
	select {
	case <-ctx.Done():
		// The SDK closes a session once its requests in flight have
		// returned, and a write the agent does not take never does: given
		// up after stdioEndWait, the agent's stdout closed (which ends such
		// a write on a pipe). ServeStdio waited for the close, and `tether
		// mcp wrap` outlived its SIGTERM for as long as the agent did not
		// read.
		closed := make(chan struct{})
		go func() {
			_ = ss.Close()
			<-waited
			close(closed)
		}()
		stuck := g.cfg.Clock.NewTimer(stdioEndWait)
		select {
		case <-closed:
		case <-stuck.C():
			_ = w.Close()
		}
		stuck.Stop()
		err = ctx.Err()
	case err = <-waited:
	case <-st.abandoned:
		// The close given up (endStdio): the agent's stdout closed, which
		// ends the write it does not take (it stayed blocked for as long as
		// the process lived).
		_ = w.Close()
	}
	select {
	case <-st.gone:
		return fmt.Errorf("mcpgate: the gateway ended the agent's stdio session: %w", st.why)
	default:
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}
