package coordinator

import (
	"errors"
	"fmt"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/store"
)

// Terms fence off earlier runs. With several control-plane replicas on one
// store, leadership moves between them, and leadership is a lease, not a
// lock: for a moment two replicas may both believe they lead (a paused
// process wakes up after its election lease expired). Two coordinators
// committing over the same leases would overwrite each other's evidence
// rows, so every Run starts a new term and every commit checks it:
//
//  1. Run increments the term counter (leases/term) in one Update;
//  2. then loads every lease in a View, which sees everything committed
//     before step 1;
//  3. every shard commit reads the counter inside its Update and refuses
//     to write unless it still holds this run's term.
//
// The store makes step 3 serializable (on etcd the commit itself compares
// the counter's value, store.Expect; Badger's committer runs Updates one
// at a time), so each commit of an earlier run either happened before
// step 1 — and step 2 loaded it — or fails with ErrFenced and was never
// acknowledged. No acknowledged decision is lost and none is overwritten.

const termSchema byte = 1

// termKey holds the current term: the number of runs that started.
var termKey = []byte("leases/term")

// ErrFenced is why a commit of a run that a newer run fenced off failed
// (wrapped in ErrCommit); such a coordinator stops serving.
var ErrFenced = fault.New(fault.Unavailable, "coordinator: fenced off by a newer run (another replica leads the leases)")

func encodeTerm(term uint64) []byte {
	e := encoder{b: []byte{termSchema}}
	e.uint(term)
	return e.b
}

func decodeTerm(b []byte) (uint64, error) {
	d := decoder{b: b}
	if v := d.byte1("schema version"); d.err == nil && v != termSchema {
		return 0, fmt.Errorf("%w: term schema version %d is not %d", ErrCorrupt, v, termSchema)
	}
	term := d.uint()
	return term, d.done()
}

// readTerm returns the stored term, 0 when none was ever started.
func readTerm(tx store.ReadTxn) (uint64, error) {
	b, err := tx.Get(termKey)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return decodeTerm(b)
}

// startTerm fences off every earlier run and returns this run's term.
func startTerm(tx store.Txn) (uint64, error) {
	term, err := readTerm(tx)
	if err != nil {
		return 0, err
	}
	term++
	return term, tx.Put(termKey, encodeTerm(term))
}

// checkTerm refuses a commit unless term is still the current one. It
// asks with store.Expect, which on etcd checks the counter inside the
// commit instead of reading it first: a shard commit is then one round
// trip to the cluster, not two. Only when the counter has moved does it
// read, to say which term now holds.
func checkTerm(tx store.ReadTxn, term uint64) error {
	if ok, err := store.Expect(tx, termKey, encodeTerm(term)); err != nil || ok {
		return err
	}
	current, err := readTerm(tx)
	if err != nil {
		return err
	}
	if current != term {
		return fmt.Errorf("%w: this run holds term %d, the store says %d", ErrFenced, term, current)
	}
	return nil
}
