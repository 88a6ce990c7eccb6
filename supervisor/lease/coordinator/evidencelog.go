package coordinator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tetherhq/tether/internal/store"
)

// The evidence log: a commit's rows under one key, folded into the jobs'
// own keys later.
//
// A renewal used to write one key of its own, its evidence row, and on
// etcd a written key costs the member CPU whatever its size (an MVCC
// revision, an index entry, a bbolt entry): about 20 µs per renewal even
// in commits of hundreds. So every commit writes all its rows, of every
// job, packed under one key of the log (leases/log/<seq>/<part>: a part
// per packBytes). A row stays in the log for logWindow commits (fewer when
// they hold more than logWindowBytes: a reader of one job reads the whole
// log); when its commit leaves the window, each of its jobs whose rows
// there are not yet folded gets one key (a pack) holding all its rows in
// the window, under the job's own prefix, named by the pack's first row,
// in the same transaction that deletes the log key. A job renewing in
// every commit thus writes a key of its own every logWindow commits, not
// every commit.
//
// A job's rows are therefore: the keys under its prefix, each one row
// (written before packing) or a pack of consecutive rows, in row order;
// then the rows of the log after the last of them. The two may overlap (a
// fold copies rows that stay in the later log keys until those leave the
// window, and a run re-folds what its predecessor may already have folded:
// it does not know), never with different bytes for one row number, so
// readers take each row number once, in order (jobRows). Nothing is lost
// in between: a log key is deleted only by the transaction that folds its
// rows, so every row of a job older than its first in the log is under its
// prefix.
//
// Packs never cross an anchor row (anchorEvery): an anchor row is always
// the first of its pack, so a read that starts decoding at an anchor finds
// its key by name, and a read from any row starts at the key of the
// anchor before it.

const (
	prefixLog = "leases/log/"
	// logWindow is how many commits' rows the log keeps, and
	// logWindowBytes how many bytes of rows (beyond its newest commit): a
	// job's rows are folded into a key of its own once per logWindow
	// commits at most, and a reader of one job's evidence or lease reads
	// the whole log, so at most about logWindowBytes.
	logWindow      = 16
	logWindowBytes = 256 << 10
	// packBytes is where a log pack or a job's pack is cut, well inside
	// store.MaxValueSize.
	packBytes = 256 << 10
	// evidenceSchemaPack is a key holding several rows: under a job's
	// prefix its consecutive rows (job ids left empty), in the log the
	// rows of one commit, each with its job id.
	evidenceSchemaPack byte = 4
)

// layoutKey marks a store written with the evidence log, where a binary
// from before it looks for job records: such a binary reads rows only
// under the jobs' keys, and would load leases without their newest rows
// (acknowledged decisions). It refuses a record whose schema it does not
// know, and fails to start, so every run writes this one, whose version
// (layoutMarker) no lease record has. The key is no job's: job ids hold
// no control character.
var layoutKey = []byte(prefixJob + "\x01evidence-log")

// holdingsLayoutKey marks, the same way, a store whose agent-tree nodes
// note what they may hold (tree.Holdings), which terminations trust to
// skip the holder indexes of the nodes that hold nothing: a binary from
// before it gives grants, privileges and tool calls without noting them.
// The binaries with the evidence log skip only layoutKey, so they refuse
// this one and do not start.
var holdingsLayoutKey = []byte(prefixJob + "\x01node-holdings")

const layoutMarker byte = 0x7f

// isLayoutKey: key is one of the layout markers, no job's record.
func isLayoutKey(key []byte) bool {
	return bytes.Equal(key, layoutKey) || bytes.Equal(key, holdingsLayoutKey)
}

// jobKeyIsReserved: job's record would be a layout marker. The RPCs
// refuse such an id anyway (a control character).
func jobKeyIsReserved(job string) bool { return isLayoutKey([]byte(prefixJob + job)) }

func logKey(seq uint64, part int) []byte {
	return fmt.Appendf(nil, "%s%016x/%04x", prefixLog, seq, part)
}

// logRow is one encoded evidence row with its job.
type logRow struct {
	job    string
	number uint64
	row    []byte
}

// rowNumber reads the number of an encoded row (every schema writes it
// right after the version byte).
func rowNumber(b []byte) (uint64, error) {
	if len(b) < 2 {
		return 0, fmt.Errorf("%w: truncated evidence row", ErrCorrupt)
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 {
		return 0, fmt.Errorf("%w: malformed evidence row number", ErrCorrupt)
	}
	return n, nil
}

// encodePack writes rows as one value. withJobs: each row names its job
// (the log); otherwise the rows are the key's job's (a job's pack).
func encodePack(dst []byte, rows []logRow, withJobs bool) []byte {
	// Sized once: grown row by row, a log pack of a commit's rows was
	// copied some ten times over on its way to its size.
	e := encoder{b: append(slices.Grow(dst, packSize(rows, withJobs)), evidenceSchemaPack)}
	e.uint(uint64(len(rows)))
	for _, r := range rows {
		if withJobs {
			e.str(r.job)
		} else {
			e.str("")
		}
		e.uint(uint64(len(r.row))) // as e.str, without a string of the row
		e.b = append(e.b, r.row...)
	}
	return e.b
}

// packSize is the length of encodePack(nil, rows, withJobs).
func packSize(rows []logRow, withJobs bool) int {
	size := 1 + uvarintLen(uint64(len(rows)))
	for _, r := range rows {
		job := 0
		if withJobs {
			job = len(r.job)
		}
		size += uvarintLen(uint64(job)) + job + uvarintLen(uint64(len(r.row))) + len(r.row)
	}
	return size
}

// uvarintLen is how many bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// decodePack reads what encodePack wrote. Under a job's prefix (job set)
// every row must be the job's: a pack naming another job is corrupt, so
// nothing written under one job's key is ever read as another's.
func decodePack(b []byte, job string, fn func(logRow) error) error {
	d := decoder{b: b}
	if v := d.byte1("schema version"); d.err == nil && v != evidenceSchemaPack {
		return fmt.Errorf("%w: evidence pack schema version %d is not %d", ErrCorrupt, v, evidenceSchemaPack)
	}
	count := d.uint()
	for i := uint64(0); i < count && d.err == nil; i++ {
		name, row := d.str(), d.str()
		if d.err != nil {
			break
		}
		switch {
		case job != "" && name != "":
			return fmt.Errorf("%w: a pack of job %q names job %q", ErrCorrupt, job, name)
		case job == "" && name == "":
			return fmt.Errorf("%w: a log row without a job", ErrCorrupt)
		case job != "":
			name = job
		}
		n, err := rowNumber([]byte(row))
		if err != nil {
			return err
		}
		if err := fn(logRow{job: name, number: n, row: []byte(row)}); err != nil {
			return err
		}
	}
	return d.done()
}

// readLog returns the log's rows in order, of job only when job is not
// empty.
func readLog(tx store.ReadTxn, job string) ([]logRow, error) {
	return readLogOf(tx, func(j string) bool { return job == "" || j == job })
}

// readLogOf is readLog of the rows whose job keep says to keep.
func readLogOf(tx store.ReadTxn, keep func(job string) bool) ([]logRow, error) {
	var rows []logRow
	err := tx.Scan([]byte(prefixLog), nil, func(key, value []byte) error {
		err := decodePack(value, "", func(r logRow) error {
			if keep(r.job) {
				rows = append(rows, r)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return nil
	})
	return rows, err
}

// jobRows calls fn with each of the job's stored rows numbered from on,
// once each, in order: the rows under its prefix, then the rows in log
// (the log's rows of this job, from readLog) after them. A row's bytes are
// the encoded row (decode with a rowReader). fn may stop the rows with
// store.ErrStopScan, as in a Scan.
func jobRows(tx store.ReadTxn, job string, from uint64, log []logRow, fn func(number uint64, key, row []byte) error) error {
	last, stopped := from-1, false
	take := func(n uint64, key, row []byte) error {
		if n <= last {
			return nil
		}
		last = n
		err := fn(n, key, row)
		stopped = errors.Is(err, store.ErrStopScan)
		return err
	}
	// A pack never crosses an anchor, so the key of the pack holding row
	// from is at or after the anchor before it.
	err := tx.Scan(evidencePrefix(job), evidenceKey(job, anchorBefore(from)), func(key, value []byte) error {
		if len(value) > 0 && value[0] == evidenceSchemaPack {
			err := decodePack(value, job, func(r logRow) error { return take(r.number, key, r.row) })
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			return nil
		}
		n, err := rowNumber(value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return take(n, key, value)
	})
	if err != nil || stopped {
		return err
	}
	for _, r := range log {
		if err := take(r.number, []byte(prefixLog), r.row); err != nil {
			if stopped {
				return nil
			}
			return err
		}
	}
	return nil
}

// logCommit is one commit's rows in the log.
type logCommit struct {
	seq   uint64
	parts int
	rows  []logRow
	bytes int
}

func rowsBytes(rows []logRow) (n int) {
	for _, r := range rows {
		n += len(r.row) + len(r.job)
	}
	return n
}

// evidenceLog is the committer's view of the log: the commits in the
// window and, for each job, its rows there that are not yet folded, in
// order. Only the run's committer touches it; a run rebuilds it from the
// store (loadLog).
type evidenceLog struct {
	seq     uint64
	window  []logCommit
	bytes   int // of the window's rows
	pending map[string][]logRow
	// failedParts is how many log keys the last failed commit meant to
	// write at seq+1: the next commit takes that seq again and deletes
	// those it does not rewrite, should the failed one have reached the
	// store after all.
	failedParts int
}

// loadLog rebuilds the log's state from the store. What a previous run
// folded is not known: every row in the window counts as unfolded, and
// may be folded again (the same bytes).
func loadLog(tx store.ReadTxn) (evidenceLog, error) {
	l := evidenceLog{pending: make(map[string][]logRow)}
	err := tx.Scan([]byte(prefixLog), nil, func(key, value []byte) error {
		var seq uint64
		var part int
		if _, err := fmt.Sscanf(string(key[len(prefixLog):]), "%016x/%04x", &seq, &part); err != nil {
			return fmt.Errorf("%w: %s: not a log key", ErrCorrupt, key)
		}
		if n := len(l.window); n == 0 || l.window[n-1].seq != seq {
			l.window = append(l.window, logCommit{seq: seq})
		}
		c := &l.window[len(l.window)-1]
		c.parts = max(c.parts, part+1)
		err := decodePack(value, "", func(r logRow) error {
			c.rows = append(c.rows, r)
			c.bytes += len(r.row) + len(r.job)
			l.bytes += len(r.row) + len(r.job)
			l.pending[r.job] = append(l.pending[r.job], r)
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		l.seq = seq
		return nil
	})
	return l, err
}

// logPlan is what one commit writes for the log, and the log's state
// once it is durable.
type logPlan struct {
	puts    []kv
	deletes [][]byte
	seq     uint64
	window  []logCommit
	bytes   int
	// pending: the jobs whose unfolded rows change (empty: all folded).
	pending map[string][]logRow
}

// plan adds a commit's rows to the log and folds the commits that leave
// the window: the oldest one, and those after it while what the fold
// writes stays under budget bytes (a commit's rows are bounded, but after
// a large commit all the window's older ones would leave at once, each
// job's unfolded rows with them); the window then keeps the rest a few
// commits longer. Nothing changes until apply (the commit may fail).
func (l *evidenceLog) plan(rows []logRow, budget int) logPlan {
	if len(rows) == 0 {
		return logPlan{seq: l.seq, window: l.window, bytes: l.bytes}
	}
	p := logPlan{seq: l.seq + 1, pending: make(map[string][]logRow)}
	unfolded := func(job string) []logRow {
		if rs, ok := p.pending[job]; ok {
			return rs
		}
		return l.pending[job]
	}
	c := logCommit{seq: p.seq, rows: rows, bytes: rowsBytes(rows)}
	for start := 0; start < len(rows); c.parts++ {
		end, size := start, 0
		for end < len(rows) && (end == start || size+len(rows[end].row)+len(rows[end].job) < packBytes) {
			size += len(rows[end].row) + len(rows[end].job) + 8
			end++
		}
		p.puts = append(p.puts, kv{logKey(p.seq, c.parts), encodePack(nil, rows[start:end], true)})
		start = end
	}
	for part := c.parts; part < l.failedParts; part++ {
		p.deletes = append(p.deletes, logKey(p.seq, part))
	}
	for _, r := range rows {
		// Clip: never append into the array the current state holds.
		p.pending[r.job] = append(slices.Clip(unfolded(r.job)), r)
	}
	p.window = append(slices.Clip(l.window), c)
	p.bytes = l.bytes + c.bytes
	folded := 0
	for len(p.window) > logWindow || (len(p.window) > 1 && p.bytes-c.bytes > logWindowBytes) {
		if folded > 0 && folded >= budget {
			break
		}
		old := p.window[0]
		p.window = p.window[1:]
		p.bytes -= old.bytes
		for _, r := range old.rows {
			rs := unfolded(r.job)
			if len(rs) == 0 || rs[0].number > r.number {
				continue // folded already
			}
			before := len(p.puts)
			p.puts = appendPacks(p.puts, r.job, rs)
			for _, w := range p.puts[before:] {
				folded += len(w.key) + len(w.value) + entryCost
			}
			p.pending[r.job] = nil
		}
		for part := range old.parts {
			p.deletes = append(p.deletes, logKey(old.seq, part))
		}
	}
	return p
}

// appendPacks adds the puts that fold rows (consecutive rows of job) under
// the job's prefix: a pack per run of rows that crosses no anchor.
func appendPacks(puts []kv, job string, rows []logRow) []kv {
	start, size := 0, 0
	for i, r := range rows {
		if i > start && (isAnchor(r.number) || size+len(r.row) > packBytes) {
			puts = append(puts, kv{evidenceKey(job, rows[start].number), encodePack(nil, rows[start:i], false)})
			start, size = i, 0
		}
		size += len(r.row) + 8
	}
	return append(puts, kv{evidenceKey(job, rows[start].number), encodePack(nil, rows[start:], false)})
}

// failed notes a plan whose commit failed.
func (l *evidenceLog) failed(p logPlan) {
	if p.seq > l.seq {
		l.failedParts = max(l.failedParts, p.window[len(p.window)-1].parts)
	}
}

// apply makes a committed plan the log's state.
func (l *evidenceLog) apply(p logPlan) {
	if p.seq > l.seq {
		l.failedParts = 0
	}
	l.seq, l.window, l.bytes = p.seq, p.window, p.bytes
	for job, rs := range p.pending {
		if len(rs) == 0 {
			delete(l.pending, job)
		} else {
			l.pending[job] = rs
		}
	}
}
