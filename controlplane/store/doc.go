// Package store is Tether's transactional key-value interface and its
// backends.
//
// Everything the control plane persists goes through Store: one interface,
// two backends (Badger embedded by default; etcd for several replicas). The
// interface is deliberately small — serializable read-write transactions with
// retry, ordered prefix scans, and prefix watches — so that every backend can
// honour the same contract, which the conformance suite in storetest checks.
//
// Keys and revisions: keys are non-empty byte strings of at most MaxKeySize
// bytes; keys starting with 0x00 are reserved for the store's own records
// (the revision among them) and are refused with ErrInvalidKey and never
// scanned or watched. Values are at most MaxValueSize bytes (ErrTooLarge).
// Every Update that changes something gets its own revision, one above the
// previous; an Update that writes nothing, or only deletes absent keys,
// takes none. Events and ReadTxn.Revision use these revisions.
//
// Durability: Update returns only after its writes are durable. The Badger
// backend gets there with a group committer: one goroutine takes the Updates
// that are waiting when it becomes free (it never waits for more), runs
// their functions one after another against one shared write batch — each in
// an overlay that reads its own writes, then the batch's, then the committed
// state, so they serialize without conflicts — commits the batch as one
// Badger transaction with SyncWrites, and only then returns to each caller.
// A batch too big for one Badger transaction is split between Updates, never
// inside one, and nobody is answered until all of it has committed. Badger's
// own SyncWrites syncs once per transaction and never shares the sync, so
// without the committer durable throughput is capped near one sync per write
// (see BASELINES.md). Calling db.Sync from a side goroutine is not a
// substitute: it syncs only the active memtable's log.
//
// Watches get each committed Update's events as one batch, in commit order,
// after the commit is durable. Delivery never blocks writers: a watcher that
// falls too far behind (BadgerOptions.WatchBuffer unread batches on Badger)
// is ended with ErrWatchLagged and must re-establish its watch and rescan.
//
// Caller duties:
//   - Keep Update functions short and free of side effects: they may be
//     retried, and on Badger they run on the committer goroutine, so every
//     other Update waits while one runs. A function that panics fails its own
//     Update with ErrPanicked and nothing else.
//   - Do not call Update from inside an Update function, nor Close from
//     inside an Update or View function (each would wait for itself), and do
//     not use a Txn or ReadTxn after its function has returned.
//   - Do not retain or modify key/value slices passed to Scan callbacks, nor
//     modify Event keys and values: watchers share them.
//   - Cancelling an Update's context abandons it only while it waits for the
//     committer; once its function has started, Update waits for the commit
//     and reports its outcome.
package store
