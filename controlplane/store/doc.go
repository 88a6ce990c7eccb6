// Package store is Tether's transactional key-value interface and its
// backends.
//
// Everything the control plane persists goes through Store: one interface,
// two backends (Badger embedded by default; etcd for several replicas). The
// interface is deliberately small — serializable read-write transactions with
// retry, ordered prefix scans, and prefix watches — so that every backend can
// honour the same contract, which the conformance suite in storetest checks.
//
// Durability: Update returns only after its writes are durable. The Badger
// backend gets there with a group committer: one goroutine collects the
// Updates that arrive together, runs them one after another against a single
// Badger transaction (so they serialize without conflicts), commits that
// transaction with SyncWrites, and only then returns to each caller. Badger's
// own SyncWrites syncs once per transaction and never shares the sync, so
// without the committer durable throughput is capped near one fsync per write
// (see BASELINES.md). Calling db.Sync from a side goroutine is not a
// substitute: it syncs only the active memtable's log.
//
// Caller duties: keep Update closures short and free of side effects (they may
// be retried, and on Badger they run on the committer goroutine); do not
// retain key/value slices passed to Scan callbacks.
package store
