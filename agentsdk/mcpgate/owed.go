package mcpgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// owedFile keeps the gateway's reports owed to the control plane on disk
// (Config.OwedReportsFile): the nodes served whose seen reports have not
// landed, and the refusals waiting for their interval's end. Kept in
// memory only, they were lost to a gateway killed (kill -9, the OOM
// killer, a node's loss) and to one whose last sending at Close failed
// (the control plane out of reach, its credential refused): a rogue
// whose request after its claim of exit was served while the control
// plane was out of reach read confirmed once the gateway was restarted.
// The file is rewritten (a new file renamed over the old, synced) as the
// debts change, and a served request whose report did not land is
// answered only once its debt is written; Start reads it and sends each
// report it holds.
type owedFile struct {
	path string
	mu   sync.Mutex // one writing at a time
	// want counts the changes asked to be written, saved the last one
	// written: a write covers every change asked before it read the debts.
	want  atomic.Uint64
	saved uint64
	final bool // Close wrote the last: none after
}

// owedReports is the file's content.
type owedReports struct {
	Owed []owedReport `json:"owed"`
}

// owedReport is one node's report owed: its holder and the token whose
// use it reports (the control plane names an expired token's holder for
// that report).
type owedReport struct {
	Node  string `json:"node"`
	Token string `json:"token"`
}

// persistOwed writes the debts of the moment to the owed reports file, if
// the gateway has one, and returns once a write that read them after this
// call began is done (without g.seen.mu or g.refusals.mu held). A write
// that fails is logged: the debts stay in memory, sent as before.
func (g *Gateway) persistOwed() {
	f := &g.owed
	if f.path == "" {
		return
	}
	want := f.want.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.final || f.saved >= want {
		return
	}
	upTo := f.want.Load()
	if err := writeOwed(f.path, g.owedNow()); err != nil {
		g.log.Error("mcpgate: writing the reports owed to the control plane failed; they are kept in memory only", "file", f.path, "error", err)
		return
	}
	f.saved = upTo
}

// owedNow is every report owed: the seen reports owed (or due, the gateway
// closing) and the refusals waiting for their interval's end.
func (g *Gateway) owedNow() []owedReport {
	var out []owedReport
	seen := map[string]bool{}
	g.seen.mu.Lock()
	for node, n := range g.seen.nodes {
		if n.owed && n.token != "" {
			out = append(out, owedReport{Node: node, Token: n.token})
			seen[node] = true
		}
	}
	g.seen.mu.Unlock()
	g.refusals.mu.Lock()
	for node, tr := range g.refusals.trailing {
		if !seen[node] {
			out = append(out, owedReport{Node: node, Token: tr.token})
			seen[node] = true
		}
	}
	for node, token := range g.refusals.sending {
		if !seen[node] {
			out = append(out, owedReport{Node: node, Token: token})
		}
	}
	g.refusals.mu.Unlock()
	return out
}

// finishOwed writes left, the reports that did not land as the gateway
// closed, as the file's last content: the next gateway to start on it
// sends them.
func (g *Gateway) finishOwed(left []seenDebt) {
	f := &g.owed
	if f.path == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.final = true
	out := make([]owedReport, 0, len(left))
	for _, d := range left {
		out = append(out, owedReport{Node: d.node, Token: d.token})
	}
	if err := writeOwed(f.path, out); err != nil {
		g.log.Error("mcpgate: writing the reports owed to the control plane as the gateway shut down failed; they are lost", "file", f.path, "reports", len(out), "error", err)
	}
}

// writeOwed replaces path with owed: a new file (0600: it holds agents'
// tokens) synced and renamed over it, the directory synced.
func writeOwed(path string, owed []owedReport) error {
	b, err := json.Marshal(owedReports{Owed: owed})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // once renamed, nothing
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// readOwed reads the reports a gateway before this one left owed in path
// (none when there is no such file).
func readOwed(path string) ([]owedReport, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mcpgate: read the owed reports file: %w", err)
	}
	var o owedReports
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("mcpgate: the owed reports file %s is not one this gateway wrote (%v); remove it to start without the reports it holds", path, err)
	}
	return o.Owed, nil
}

// loadOwed sends, at Start, each report a gateway before this one left
// owed in the file: owed again here (kept until one lands), started now.
func (g *Gateway) loadOwed() error {
	if g.owed.path == "" {
		return nil
	}
	owed, err := readOwed(g.owed.path)
	if err != nil {
		return err
	}
	for _, o := range owed {
		if o.Node == "" || o.Token == "" {
			continue
		}
		g.owePastSeen(o.Node, o.Token)
	}
	if len(owed) > 0 {
		g.log.Warn("mcpgate: sending the reports a gateway before this one owed the control plane", "file", g.owed.path, "reports", len(owed))
	}
	return nil
}
