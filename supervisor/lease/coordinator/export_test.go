package coordinator

import (
	"bytes"
	"context"

	"github.com/tetherhq/tether/internal/store"
)

// ShardOf is the shard that owns job.
func (c *Coordinator) ShardOf(job string) int { return c.shardOf(job).index }

// QueuedBatches is how many sealed batches wait for the committer.
func (c *Coordinator) QueuedBatches() int { return len(c.commitQueue) }

// EvidenceLayout is how a job's rows are stored: the first and last row of
// each key under its prefix (equal for a key of one row), and how many of
// its rows wait in the evidence log.
type EvidenceLayout struct {
	Keys    [][2]uint64
	Packs   int
	LogRows int
	LogKeys int
}

// LayoutOf reads the job's evidence layout from the store.
func LayoutOf(st store.Store, job string) (EvidenceLayout, error) {
	var l EvidenceLayout
	err := st.View(context.Background(), func(tx store.ReadTxn) error {
		l = EvidenceLayout{}
		err := tx.Scan(evidencePrefix(job), nil, func(key, value []byte) error {
			if value[0] != evidenceSchemaPack {
				n, err := rowNumber(value)
				l.Keys = append(l.Keys, [2]uint64{n, n})
				return err
			}
			l.Packs++
			span := [2]uint64{}
			err := decodePack(value, job, func(r logRow) error {
				if span[0] == 0 {
					span[0] = r.number
				}
				span[1] = r.number
				return nil
			})
			l.Keys = append(l.Keys, span)
			return err
		})
		if err != nil {
			return err
		}
		if err := tx.Scan([]byte(prefixLog), nil, func(_, _ []byte) error { l.LogKeys++; return nil }); err != nil {
			return err
		}
		rows, err := readLog(tx, job)
		l.LogRows = len(rows)
		return err
	})
	return l, err
}

// UnpackEvidence rewrites every job's stored rows in the layout written
// before the evidence log: each row under a key of its own (the same
// bytes), no packs, no log. The store must not be in use.
func UnpackEvidence(st store.Store) error {
	return st.Update(context.Background(), func(tx store.Txn) error {
		log, err := readLog(tx, "")
		if err != nil {
			return err
		}
		byJob := map[string][]logRow{}
		for _, r := range log {
			byJob[r.job] = append(byJob[r.job], r)
		}
		var jobs []string
		err = tx.Scan([]byte(prefixJob), nil, func(key, _ []byte) error {
			if !isLayoutKey(key) {
				jobs = append(jobs, string(key[len(prefixJob):]))
			}
			return nil
		})
		if err != nil {
			return err
		}
		var logKeys [][]byte
		if err := tx.Scan([]byte(prefixLog), nil, func(key, _ []byte) error {
			logKeys = append(logKeys, bytes.Clone(key))
			return nil
		}); err != nil {
			return err
		}
		for _, job := range jobs {
			var rows []logRow
			var keys [][]byte
			err := jobRows(tx, job, 1, byJob[job], func(n uint64, key, row []byte) error {
				rows = append(rows, logRow{job: job, number: n, row: bytes.Clone(row)})
				if bytes.HasPrefix(key, evidencePrefix(job)) {
					keys = append(keys, bytes.Clone(key))
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, k := range keys {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
			for _, r := range rows {
				if err := tx.Put(evidenceKey(job, r.number), r.row); err != nil {
					return err
				}
			}
		}
		if err := tx.Delete(layoutKey); err != nil { // no marker before the log
			return err
		}
		if err := tx.Delete(holdingsLayoutKey); err != nil {
			return err
		}
		for _, k := range logKeys {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// LaggingRecords counts the jobs whose stored record lags their stored
// rows (a load replays those rows after the record).
func LaggingRecords(st store.Store) (int, error) {
	n := 0
	err := st.View(context.Background(), func(tx store.ReadTxn) error {
		n = 0
		log, err := readLog(tx, "")
		if err != nil {
			return err
		}
		byJob := map[string][]logRow{}
		for _, r := range log {
			byJob[r.job] = append(byJob[r.job], r)
		}
		var records []record
		err = tx.Scan([]byte(prefixJob), nil, func(key, value []byte) error {
			if isLayoutKey(key) {
				return nil
			}
			r, err := decodeRecord(value)
			records = append(records, r)
			return err
		})
		if err != nil {
			return err
		}
		for _, r := range records {
			rows := r.Rows
			if err := catchUp(tx, &r, byJob[r.Lease.JobID]); err != nil {
				return err
			}
			if r.Rows > rows {
				n++
			}
		}
		return nil
	})
	return n, err
}

// SetApplyWindow makes applyAll judge at most n of a holder's jobs at a
// time until the test ends, so that a test can act between two windows
// (each waits for the commit of the one before).
func SetApplyWindow(t interface{ Cleanup(func()) }, n int) {
	was := applyWindow
	applyWindow = n
	t.Cleanup(func() { applyWindow = was })
}

// CountReads is how many entries CountHeldBy's shards have read.
func (c *Coordinator) CountReads() int64 { return c.countReads.Load() }

// ListCopies is how many leases (and job ids) the shards have copied
// into their answers to listings.
func (c *Coordinator) ListCopies() int64 { return c.listCopies.Load() }

// ListWalks is how many jobs the shards have visited to answer pages of
// holders' listings.
func (c *Coordinator) ListWalks() int64 { return c.listWalks.Load() }

// HoldersRemembered is how many holders the bounds remember an account
// of.
func (c *Coordinator) HoldersRemembered() int {
	c.open.mu.Lock()
	defer c.open.mu.Unlock()
	return len(c.open.accounts)
}
