// Package grantstore is the store-backed shell around the capability core:
// it persists grants, tombstones and the revocation feed in the control
// plane's transactional store, serves CapabilityService (through the
// controlplane handler), and runs the background work — following the
// feed, marking revoked subtrees, pruning old tombstones.
//
// Every decision is the pure core's (package capability); this package
// reads what the core needs, calls it with the injected clock, and writes
// its result. Decisions are made on a read snapshot, outside the store's
// single committer; the write then checks that nothing the decision read
// has changed (optimistic concurrency) and starts over if it has. Nothing
// is acknowledged before the store has committed it durably.
//
// # Key layout
//
// Keys are readable strings, like the supervisor's. Sequences are
// zero-padded to 20 digits so that byte order is numeric order.
//
//	grants/grant/<grant id>                         capability.Grant (tether.v1.Grant's encoding, internal/storecodec)
//	grants/holder/<node id>/<grant id>              "" — grants held by a node
//	grants/child/<parent grant id>/<grant id>       "" — direct delegations of a grant
//	grants/derived/<ancestor grant id>/<grant id>   "" — one entry per chain entry, so the whole
//	                                                     subtree of a grant is one prefix
//	grants/issued/<unix nanos, 20 digits>/<grant id> "" — creation order, for revoke-issued-before
//	grants/tombstone/<sequence>                     capability.Tombstone (tether.v1.Tombstone's encoding): the revocation feed
//	grants/feed/head                                the last sequence assigned (decimal)
//	grants/feed/compacted                           the highest sequence pruned (decimal)
//	grants/mark/<sequence>                          markJob (JSON): a subtree still to be marked
//
// A new grant and all its index entries are written in one transaction.
// Indexed fields (holder, parent, chain, creation time) never change, so a
// state change rewrites only grants/grant/<id>.
//
// # Revocation
//
// Revoking a grant writes, in one transaction: the grant in its revoked
// state, one tombstone at the next feed sequence, the new feed head, and —
// when the grant has descendants, which one index probe tells — one
// marking job at the same sequence. That is the whole request: its cost
// does not depend on the size of the subtree. A bulk revocation (by
// holder, by subtree, issued before a time) decides authority for every
// top grant on one snapshot before writing anything, so a refusal changes
// nothing, then writes one tombstone per top grant (a grant none of whose
// ancestors is also targeted) in chunks of bulkChunk.
//
// Until the marker has run, a descendant's stored state still says active;
// every read path (GetGrant, ListGrants, Introspect, Refresh, Delegate,
// HeldBy) walks the chain and shows it revoked, and verifiers reject it by
// its chain. The marker only makes the stored state say what the chain
// already implies.
//
// # The revocation feed
//
// The feed is the ordered list of live tombstones. WatchRevocations(after)
// streams it to a follower (a verifier) positioned at sequence after:
//
//   - Sequence. Tombstones are numbered 1, 2, 3… in commit order; a
//     message's Head is the position the follower reaches with it — every
//     tombstone up to Head has been sent. Head is the feed head, except in
//     a message cut short by MaxFeedBatch, where it is the last tombstone's
//     sequence and the next message follows at once.
//   - Resume. A follower reconnects with after = the last Head it applied
//     and receives exactly the tombstones above it. Applying a tombstone
//     twice or out of order is harmless (revocation only narrows), so
//     resuming never needs more precision than that.
//   - Snapshot. When after is below the compaction point (tombstones above
//     it were pruned while the follower was away) or above the head of the
//     store itself (the follower followed another history, e.g. a restored
//     store), the first message has Snapshot set: it and the messages up to
//     the head are a full copy of the live tombstones, and the follower
//     replaces its set with them rather than adding. A message cut short
//     at MaxFeedBatch says so (Continues); a snapshot is whole only with
//     the first of its messages that does not continue, and a verifier
//     keeps its old set (adding the snapshot's tombstones to it) until
//     then: one that replaced its set with the first message accepted,
//     until the last, a token whose revocation came later in the copy.
//   - Catching up. When after is above this replica's head but not the
//     store's (the follower came from a replica whose watch was ahead of
//     this one's), the stream sends nothing, not even a heartbeat, until
//     this replica's feed reaches after, then resumes as above: a snapshot
//     there would have the follower drop revocations it applied.
//   - Heartbeat. When nothing is revoked, the stream sends a message with no
//     tombstones and the follower's Head every Config.Heartbeat (default two
//     seconds). A follower measures staleness from the last message it
//     received, on its own clock, and fails closed once that is older than
//     its staleness budget — so the budget must be several heartbeats.
//
// The feed is served from memory: RunFeed loads it with one scan, then
// applies a store watch on grants/tombstone/ (watch first, scan, drop events
// at or below the scan's revision; rescan when the watch lags). Any replica
// can serve it.
//
// Tombstones leave the stored feed only once their DropAfter has passed on
// the control plane's clock (capability.DropAfter: revoked_at +
// capability.MaxTokenTTL + capability.MaxLeeway, when no token that carries
// the grant can still be accepted). The bound is counted from when the
// revocation commits, if that is later than revoked_at (when it was
// decided, on a snapshot): a Refresh or Delegate that read the grant in
// between saw it active and minted a token at its own later time, which
// outlived a bound counted from the decision (rogue38i). PruneTombstones
// drops them oldest first and stops at the first grant tombstone still
// needed;
// grants/feed/compacted is the highest sequence pruned. Pruning never
// touches grants: a revoked grant stays revoked (until its holder's new
// grants drop it, see Grants per node).
//
// The feed also carries the revocations of bearer tokens — operator tokens
// and the other tokens the control plane mints for its own API —
// (RevokeBearer, bearer.go): one tombstone named by the token's id, kept
// until the token itself expires. The pruner skips such a tombstone rather
// than stopping at it, so a long-lived one can sit below the compaction
// point; a follower behind that point gets a snapshot of every live
// tombstone, so it is never missed.
//
// Each grant tombstone names the grant's holder and lineage (the root of
// the holder's tree), so that the control plane can show an agent only its
// own lineage's revocations. The feed in memory keeps each lineage's
// tombstones apart too (View, LineageFeed): an agent's feed walks its
// lineage's alone, whatever other trees have revoked, with the whole
// feed's positions, heads and snapshots; a message that only moves the
// head past other lineages' tombstones is marked Skipped.
//
// # Grants per node
//
// A node holds at most Config.MaxPerNode live grants delegated by agents,
// and as many issued by operators (makeRoom, in the transaction that
// writes a new grant; past it the grant is refused, ErrLimit). Each new
// grant also drops its holder's oldest dead grants of its kind (revoked,
// or expired) past as many again — deleting the grant with its index
// entries — except one another grant derives from: every chain names all
// its ancestors. Its descendants are dead too, and once their holders
// drop them it can go. The marker, and a revocation that read a grant
// dropped since, skip it: it was dead.
//
// # The marker
//
// RunMarker turns the persisted marking jobs into stored states, in the
// background, never in a request path. Its bounds:
//
//   - one job at a time, oldest sequence first;
//   - at most Config.MarkBatch descendants (default 512) per transaction,
//     read in grants/derived/ order after the job's cursor, in slices of
//     the index rather than to its end (on etcd a range request costs the
//     whole range: see descendantsAfter), with the batch's grants fetched
//     together;
//   - the decisions are made on a read snapshot, outside the committer, and
//     the write re-checks each grant and decides again if it changed;
//   - the job's cursor (the last descendant handled) is written in the same
//     transaction as the batch, and the job is deleted in the transaction
//     that handles its last descendant.
//
// A crash or restart therefore repeats at most one uncommitted batch, and
// repeating one is harmless. The marker is a reconcile loop
// (internal/reconcile) of one key: a stored job — this replica's or
// another's — wakes it through its store watch, a failed batch is retried
// with a backoff on the clock, and a lagged watch costs a rescan. Each
// descendant is marked by the earliest
// revocation among its ancestors (see covered), unless it had expired by
// then, so the outcome depends neither on the order in which jobs run nor
// on when the marker runs — and it is what the read paths show before it.
//
// # Caller duties
//
// The control plane authenticates the caller and passes its principal and
// roles (Caller); it runs RunFeed, RunMarker and RunPruner for as long as
// it serves, and maps errors (this package's sentinels and the core's) to
// Connect codes by their category (internal/fault). Messages name fields, grants,
// scopes and nodes, never token text.
package grantstore
