// Package store is Tether's transactional key-value contract: the Store
// interface, its errors and limits, and the helpers every caller or backend
// shares (Prefetch, Read, IDsAfter; RunUpdate and WatchEnd for backends).
// It links no backend, so every layer (capability, supervisor, the lease
// machine) imports it freely; the backends live beneath it, in badgerstore
// and etcdstore, and only the composition root (controlplane, cmd) and test
// harnesses open one.
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
// Every Update that changes something gets its own revision, above the
// previous one (on Badger exactly one above; on etcd the cluster's revision,
// which also moves for writes outside the store's namespace, so it may skip
// numbers); an Update that writes nothing, or only deletes absent keys,
// takes none. Events and ReadTxn.Revision use these revisions.
//
// Durability: Update returns only after its writes are durable. The Badger
// backend gets there with a group committer: one goroutine at a time takes
// the Updates that are waiting when it becomes free (it never waits for
// more; an Update that finds nobody committing commits on its caller's
// goroutine, sparing a lone Update two goroutine hand-offs), runs
// their functions one after another against one shared write batch — each in
// an overlay that reads its own writes, then the batch's, then the committed
// state, so they serialize without conflicts — commits the batch as one
// Badger transaction with SyncWrites, and only then returns to each caller.
// That sync is one: Badger's memtable log (WAL), which holds every value
// of the store; Badger's value log holds none (values stay below its
// threshold) and is not synced per commit (badgerstore/vlogsync.go).
// A batch too big for one Badger transaction is split between Updates, never
// inside one, and nobody is answered until all of it has committed. Badger's
// own SyncWrites syncs once per transaction and never shares the sync, so
// without the committer durable throughput is capped near one sync per write
// (the `store/commit` figures of `make bench` show it). Calling db.Sync from a side goroutine is not a
// substitute: it syncs only the active memtable's log.
//
// Watches get each committed Update's events as one batch, in commit order,
// after the commit is durable. Delivery never blocks writers: a watcher that
// falls too far behind (BadgerOptions.WatchBuffer unread batches on Badger)
// is ended with ErrWatchLagged and must re-establish its watch and rescan.
//
// The etcd backend (docs/etcd.md has the operator's view). Every key lives
// in one etcd cluster under a prefix (default "/tether/"); the store's own
// keys (leader elections) sit in the reserved part of that namespace, where
// callers never see them. The store's revision is etcd's.
//
//   - Reads: the first read of a View or of an Update attempt is
//     linearizable and fixes the snapshot's revision; every later read is
//     served at that revision (WithRev), so a function reads one consistent
//     snapshot. Scans page through etcd, 512 keys a request.
//   - Update is an optimistic transaction. Its writes are buffered; it
//     records the mod revision of every key it read (0 for a key read as
//     absent) and the key range each scan covered (up to where the scan
//     stopped). The commit is one etcd Txn: If(every read key's mod
//     revision is unchanged, and no key of a scanned range has a mod
//     revision above the snapshot) Then(puts and deletes). The per-key
//     comparisons catch keys changed or deleted since the snapshot; the
//     range comparisons catch keys inserted into a scanned range
//     (phantoms). If the comparisons hold, the function's reads are still
//     true at the commit, so Updates are serializable. An Update that reads
//     nothing commits without comparisons (a blind write never conflicts);
//     one that writes nothing needs no commit.
//   - Expect (a fencing read: does this key hold this value?) reads
//     nothing on an Update's first attempt: it answers true and adds a
//     comparison of the key's value (or, for absence, its creation
//     revision) to the commit, which stands for a read of the key at the
//     commit's revision. If it fails, the attempt is a conflict like any
//     other, and on later attempts Expect reads. An Update whose only read
//     is a fencing token (the lease coordinator's term) is one request; one
//     that writes nothing but deferred an Expect commits the comparisons
//     alone.
//   - Conflicts: a failed comparison, or a snapshot compacted away while
//     the function was reading it, runs the function again on a fresh
//     snapshot. The first attempt runs beside the process's other Updates;
//     retries run alone in the process (the others wait), so goroutines of
//     one replica take turns on a hot key instead of colliding, and a
//     function that reads a lot is not starved by small writers. Between
//     attempts a jittered exponential backoff (2 ms growing to 100 ms)
//     separates replicas. After EtcdOptions.MaxAttempts (16) Update returns
//     an error wrapping ErrConflict.
//   - Durability: etcd answers a Txn only once raft has committed it — a
//     quorum of members has it in its write-ahead log, which each member
//     fsyncs before acknowledging — and applied it. So when Update returns
//     nil the writes survive the loss of a minority of members, and a crash
//     of all of them. (A single member persists before applying since etcd
//     3.4.21 and 3.5.5; OpenEtcd warns about older releases.) A commit is not
//     cancelled with the caller's context (EtcdOptions.CommitTimeout bounds
//     it); if it fails other than by a refusal, its outcome is unknown, and
//     the error says so.
//   - Limits: one Update is one etcd request, which cannot be split without
//     losing atomicity. Its writes, and separately its comparisons (one per
//     key read, one per scanned range), count against etcd's
//     --max-txn-ops, and the whole request against --max-request-bytes.
//     etcd's defaults (128 and 1.5 MiB) are far too small: every member
//     must run with --max-txn-ops=65536 --max-request-bytes=16777216
//     (EtcdMaxTxnOps, EtcdMaxRequestBytes), which lets one Update mark a
//     10,000-node subtree. Beyond them Put (or the commit) fails with
//     ErrTooLarge, naming the flag; so does a server started with smaller
//     limits than the store was told.
//   - Watches read the revision R, then watch from R+1, so every change
//     committed after Watch returns is delivered, one batch per etcd
//     revision, in order. A watch ends with ErrWatchLagged when its
//     consumer falls EtcdOptions.WatchBuffer batches behind, when etcd
//     compacted revisions it had not delivered yet (on reconnection), when
//     its member loses the raft leader, or when etcd ends it for any other
//     reason: the consumer re-establishes it and rescans.
//
// Caller duties:
//   - Keep Update functions short and free of side effects: they may be
//     retried, and on Badger they run on the committing goroutine (the
//     committer's, or another Update's caller's), so every other Update
//     waits while one runs (on etcd, while a retry runs). A function that panics fails its own
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
