package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/store"
)

// Chunked terminations.
//
// A termination's work grows with its subtree, a store transaction's does
// not: so every step that touches the subtree node by node — marking,
// escalating, cancelling, revoking, writing the record — runs in chunks of
// at most ChunkSize nodes (or calls), one transaction each, and persists in
// that same transaction how far it has got (Termination.Cursor). A chunk is
// guarded by the cursor it read: a repeated chunk (a crash before it
// committed, a second reconciler) does nothing twice, and a restart resumes
// after the last chunk that committed.
//
// The subtree index. The mark lists the subtree node by node, in the order
// it finds the nodes (breadth first, the roots first), each entry with a
// sequence number, what the termination does with the node (Reach) and the
// other termination involved, if any. Each chunk stores its entries packed
// (subtreePack): one key per pack of up to subtreePackEntries entries,
// terminations-nodes/<termination id>/<sequence of the pack's last entry>,
// not one key per node, so that the index costs a write per pack and its
// readers a key per pack. The index is the mark's work queue as well: entry k's children are listed,
// marked and appended after entry k-1's, and the cursor is the entry being
// expanded and its last child listed. Later steps walk the index in order.
// The stored termination keeps only the counts, so it stays small whatever
// the subtree.
//
// Spawns. The first chunk marks the roots, and Spawn refuses, in the
// transaction that writes the child, a parent that is not running or one
// of whose ancestors is stopping or stopped: from the first chunk on no
// node of the subtree can spawn, however far the mark has got, so the
// subtree the mark walks is fixed and the mark ends. The chunks after the
// roots' rely on that: they read the child lists they walk before their
// transaction, unguarded (planMark), since none of them can change any
// more; what can (a node's state, its open calls) each chunk reads and
// guards in its transaction. Every node of the subtree gets one entry (a node
// has one parent; a root named inside another root's subtree is skipped
// there). Tool calls begun by a node before its chunk are stamped into the
// termination with it, and none can begin after.
//
// Revocation is immediate for verifiers as before: the first revocation
// chunk holds the roots, whose grants' tombstones revoke every grant
// derived from them at once; later chunks revoke what the subtree holds
// from elsewhere.
//
// Ownership. A node taken over by another termination names it
// (Node.TerminationId); the entry stays. A step that acts on the members
// acts on the entries whose node still names this termination, and the
// record lists the others as superseded, naming the one that has them.

// DefaultChunkSize is how many nodes (or tool calls) one transaction of a
// termination handles when Supervisor.ChunkSize is zero. 1,000 nodes keep a
// mark chunk to a few thousand writes and a record part to a few hundred
// KiB, well inside Badger's and etcd's transaction limits.
const DefaultChunkSize = 1000

func (s *Supervisor) chunkSize() int {
	if s.ChunkSize > 0 {
		return s.ChunkSize
	}
	return DefaultChunkSize
}

// Counts counts an Indexed termination's subtree index.
type Counts struct {
	// Listed: entries in the index (the subtree's nodes found so far).
	Listed int `json:"listed,omitempty"`
	// Members: nodes this termination stops (marked or taken over, less
	// those handed over since). TakenOver: of those, taken over from
	// another termination.
	Members   int `json:"members,omitempty"`
	TakenOver int `json:"taken_over,omitempty"`
	// HandedOver: nodes another termination accounts for (left to it at
	// the mark, or taken over by it since). Prior: nodes an earlier
	// termination had terminated.
	HandedOver int `json:"handed_over,omitempty"`
	Prior      int `json:"prior,omitempty"`
}

// Cursor is how far a chunked step has got. Step is the step (ActWait: none
// in progress); Entry the next entry of the subtree index to handle; After
// the last child listed of that entry (mark) or the last call handled
// (cancel, record).
type Cursor struct {
	Step  Action `json:"step,omitempty"`
	Entry int    `json:"entry,omitempty"`
	After string `json:"after,omitempty"`
	// The record being written: its id, the parts written so far, whether
	// its calls are done, and its unaccounted members so far.
	RecordID    string `json:"record_id,omitempty"`
	Parts       int    `json:"parts,omitempty"`
	CallsDone   bool   `json:"calls_done,omitempty"`
	Unaccounted int    `json:"unaccounted,omitempty"`
	// A chunk whose members held more leases than one part carries
	// (Supervisor.LeasePageBytes): LeasesPending says the leases of the
	// members of entries LeasesFrom up to Entry (terminated by this
	// termination in the chunk's transaction) are still being written, in
	// parts of their own, in order of job id then lease id; LeasesAfter is
	// the last one written (leaseKey).
	LeasesPending bool   `json:"leases_pending,omitempty"`
	LeasesFrom    int    `json:"leases_from,omitempty"`
	LeasesAfter   string `json:"leases_after,omitempty"`
	// A chunk whose members held more grants than one part carries:
	// GrantsPending says their grants are still being written, in parts
	// of their own and in order of grant id, before their leases (so
	// LeasesPending and LeasesFrom are set with it); GrantsAfter is the
	// last one written.
	GrantsPending bool   `json:"grants_pending,omitempty"`
	GrantsAfter   string `json:"grants_after,omitempty"`
	// RevokeBegan is when the revocation's chunk at Entry began calling
	// its members' privileges' hooks, stored before the first call: a
	// restart before the chunk commits runs the chunk again, and decides
	// expired only what had expired by then (privilege.DispatchReadBegun).
	// Zero once the chunk committed.
	RevokeBegan time.Time `json:"revoke_began,omitzero"`
}

// DefaultLeasePageBytes bounds, when Supervisor.LeasePageBytes is zero,
// the encoded leases one record part carries, and so the grants, and the
// held index one transaction of the revocation writes: a node may hold
// any number of leases (finished ones included) and of grants (expired
// and revoked ones included), and a chunk writes its part in one
// transaction, which Badger and etcd bound.
const DefaultLeasePageBytes = 512 << 10

func (s *Supervisor) pageBytes() int {
	if s.LeasePageBytes > 0 {
		return s.LeasePageBytes
	}
	return DefaultLeasePageBytes
}

// privilegeRecordBytes is a bound on what a registered privilege weighs in
// the transaction of its chunk of the record: its entry, and the privilege
// itself when the record decides it.
func privilegeRecordBytes(p privilege.Privilege) int {
	return 2*(len(p.ID)+len(p.NodeID)+len(p.GrantID)+len(p.Kind)+len(p.ExternalID)+len(p.RegisteredBy)+len(p.Error)) + len(p.RevokeURL) + 256
}

// privilegeCut is how many of the n entries from sequence from a chunk of
// the record takes so that the privileges the held index lists for them
// (items, in order of sequence, privs the privileges they name) weigh at
// most limit bytes: all n when they do, and at least one entry.
func privilegeCut(items []heldItem, privs []privilege.Privilege, from, n, limit int) int {
	size := 0
	for i := range n {
		for len(items) > 0 && items[0].seq == from+i {
			size += privilegeRecordBytes(privs[0])
			items, privs = items[1:], privs[1:]
		}
		if size > limit && i > 0 {
			return i
		}
	}
	return n
}

// grantBytes is a bound on g's encoded size in a record part (as a
// privilege, and its id on its holder's entry).
func grantBytes(g HeldGrant) int {
	return 3*len(g.GrantID) + len(g.NodeID) + len(g.RevokedBy) + len(g.Issuer) + 64
}

// grantPage sorts grants by id and splits off, after the id after (none
// when empty), the page one record part carries: at most limit bytes, at
// least one grant. more says grants remain after the page. Fewer grants
// than a page are returned whole, as given.
func grantPage(grants []HeldGrant, after string, limit int) (page []HeldGrant, more bool) {
	if after == "" {
		size := 0
		for _, g := range grants {
			size += grantBytes(g)
		}
		if size <= limit {
			return grants, false
		}
	}
	grants = slices.Clone(grants)
	slices.SortFunc(grants, func(a, b HeldGrant) int { return strings.Compare(a.GrantID, b.GrantID) })
	i := 0
	if after != "" {
		i, _ = slices.BinarySearchFunc(grants, after, func(g HeldGrant, id string) int { return strings.Compare(g.GrantID, id) })
		for i < len(grants) && grants[i].GrantID <= after {
			i++
		}
	}
	size := 0
	j := i
	for ; j < len(grants); j++ {
		size += grantBytes(grants[j])
		if size > limit && j > i {
			break
		}
	}
	return grants[i:j], j < len(grants)
}

// leaseKey orders a record's leases: by job id, then lease id.
func leaseKey(l RecordLease) string { return l.JobID + "\x00" + l.LeaseID }

// leaseBytes is a bound on l's encoded size in a record part.
func leaseBytes(l RecordLease) int {
	return len(l.JobID) + len(l.LeaseID) + len(l.HolderIdentity) + len(l.EndedByNodeID) + 64
}

// leasePage sorts leases (leaseKey) and splits off, after the key after
// (none when empty), the page one record part carries: at most limit
// bytes, at least one lease. more says leases remain after the page.
func leasePage(leases []RecordLease, after string, limit int) (page []RecordLease, more bool) {
	sort.Slice(leases, func(i, j int) bool { return leaseKey(leases[i]) < leaseKey(leases[j]) })
	i := 0
	if after != "" {
		i = sort.Search(len(leases), func(k int) bool { return leaseKey(leases[k]) > after })
	}
	size := 0
	j := i
	for ; j < len(leases); j++ {
		size += leaseBytes(leases[j])
		if size > limit && j > i {
			break
		}
	}
	return leases[i:j], j < len(leases)
}

const prefixSubtree = "terminations-nodes/" // terminations-nodes/<termination id>/<sequence of the last entry> → []subtreeEntry (JSON), or one subtreeEntry (JSON) as stored before the packs

func subtreePrefix(term string) []byte { return []byte(prefixSubtree + term + "/") }
func subtreeKey(term string, seq int) []byte {
	return []byte(fmt.Sprintf("%s%s/%010d", prefixSubtree, term, seq))
}

// The held index. The revocation lists, in the transaction that moves its
// cursor past a chunk, the grants and the privileges the chunk's members
// hold, under terminations-held/<termination id>/<g|p>/<sequence>/<id>
// (the sequence of the member's entry in the subtree index; the value is
// the node's id). A node is issued no grant and registers no privilege
// once it is marked (both refuse a node that is not running, in a
// transaction that reads the node), so the list is what the members hold
// until the record: the record's chunks and the reconciler's count of
// hooks still pending read it, a range per chunk (or per termination),
// instead of each member's grants and privileges, a range per node.
const prefixHeld = "terminations-held/"

// Kinds of the held index.
const (
	heldGrant     = 'g'
	heldPrivilege = 'p'
)

func heldPrefix(term string, kind byte) []byte {
	return []byte(prefixHeld + term + "/" + string(kind) + "/")
}
func heldKey(term string, kind byte, seq int, id string) []byte {
	return []byte(fmt.Sprintf("%s%010d/%s", heldPrefix(term, kind), seq, id))
}

// heldItem is one grant or privilege of the held index.
type heldItem struct {
	kind     byte // heldGrant or heldPrivilege (as written; readHeld leaves it zero)
	seq      int
	id, node string
}

// putHeld writes items to the held index of term.
func putHeld(tx store.Txn, term string, items []heldItem) error {
	for _, it := range items {
		if err := tx.Put(heldKey(term, it.kind, it.seq, it.id), []byte(it.node)); err != nil {
			return err
		}
	}
	return nil
}

// heldPages splits items into pages whose keys and values weigh at most
// limit bytes each (a page holds one item at least): at least one page,
// the last possibly empty.
func heldPages(term string, items []heldItem, limit int) [][]heldItem {
	var pages [][]heldItem
	size, from := 0, 0
	for i, it := range items {
		n := len(prefixHeld) + len(term) + len(it.id) + len(it.node) + 32
		if size+n > limit && i > from {
			pages = append(pages, items[from:i])
			size, from = 0, i
		}
		size += n
	}
	return append(pages, items[from:])
}

// grantsHeld is the grants the members ids hold, with their outcomes:
// those of the termination's held index (held, the members' entries)
// when t has one, else the members' as the grant store lists them now.
// Nil without a grant store.
func (s *Supervisor) grantsHeld(ctx context.Context, t Termination, held []heldItem, ids []string) ([]HeldGrant, error) {
	var grants []HeldGrant
	var err error
	switch {
	case s.Grants == nil:
		return nil, nil
	case t.HeldIndexed:
		listed := make([]HeldGrant, len(held))
		for i, it := range held {
			listed[i] = HeldGrant{GrantID: it.id, NodeID: it.node}
		}
		grants, err = s.Grants.Outcomes(ctx, listed)
	default:
		grants, err = s.Grants.HeldBy(ctx, ids)
	}
	if err != nil {
		return nil, fmt.Errorf("list grants: %w", err)
	}
	return grants, nil
}

// readHeld reads the items of kind the held index lists for the entries
// from sequence from up to (not including) to; to < 0: to the end.
func readHeld(tx store.ReadTxn, term string, kind byte, from, to int) ([]heldItem, error) {
	prefix, start := heldScan(term, kind, from)
	var out []heldItem
	err := tx.Scan(prefix, start, func(k, v []byte) error {
		rest := string(k[len(prefix):])
		seq, err := strconv.Atoi(rest[:min(10, len(rest))])
		if err != nil || len(rest) < 12 {
			return fmt.Errorf("supervisor: malformed held index key %q", k)
		}
		if to >= 0 && seq >= to {
			return store.ErrStopScan
		}
		out = append(out, heldItem{seq: seq, id: rest[11:], node: string(v)})
		return nil
	})
	return out, err
}

// heldScan is the prefix and the start of readHeld's scan from sequence
// from (a nil start: from the first item).
func heldScan(term string, kind byte, from int) (prefix, start []byte) {
	prefix = heldPrefix(term, kind)
	if from > 0 {
		start = []byte(fmt.Sprintf("%s%010d/", prefix, from))
	}
	return prefix, start
}

// heldScanFrom is readHeld's scan from sequence from, for PrefetchReads.
func heldScanFrom(term string, kind byte, from int) store.ScanFrom {
	prefix, start := heldScan(term, kind, from)
	return store.ScanFrom{Prefix: prefix, Start: start}
}

// mayHold keeps the ids whose holdings (by id) say they may hold one of
// kind, in order.
func mayHold(ids []string, holds map[string]tree.Holdings, kind tree.Holdings) []string {
	var out []string
	for _, id := range ids {
		if holds[id].May(kind) {
			out = append(out, id)
		}
	}
	return out
}

// heldOf keeps the items held by members, their ids in order.
func heldOf(items []heldItem, members map[string]bool) []heldItem {
	var out []heldItem
	for _, it := range items {
		if members[it.node] {
			out = append(out, it)
		}
	}
	return out
}

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// subtreeEntry is one node of a termination's subtree index.
type subtreeEntry struct {
	Node  string `json:"n"`
	Reach Reach  `json:"r"`
	// Other: the termination the node was taken over from (ReachTakeOver),
	// left to (ReachLeave) or terminated by (ReachPrior). State: the
	// node's state under it when taken over. Record: its record (prior).
	Other  string `json:"o,omitempty"`
	State  string `json:"s,omitempty"`
	Record string `json:"rec,omitempty"`
	// Holds: what the node may hold, as it said when the mark listed it
	// (tree.Holdings; zero, as in an entry written before the bits were
	// kept: anything). The mark's walk lists a node's children, and the
	// revocation reads a member's grants and privileges, only when it may
	// have some.
	Holds tree.Holdings `json:"h,omitempty"`
}

func (e subtreeEntry) member() bool { return e.Reach == ReachMark || e.Reach == ReachTakeOver }

// Packs of the subtree index. A pack holds consecutive entries, at most
// subtreePackEntries of them and about subtreePackBytes of JSON, under the
// sequence of its last entry: packs are written in sequence order and never
// overlap, so a scan from the key of sequence k starts at the pack that
// holds entry k. An entry never changes once the mark wrote it. An index
// stored before the packs holds one entry per key, under its own sequence:
// a pack of one, read the same way. Variables so tests can split packs.
var (
	subtreePackEntries = DefaultChunkSize
	subtreePackBytes   = 256 << 10
)

// putSubtreeEntries stores entries, the index's entries from sequence
// first on, in packs.
func putSubtreeEntries(tx store.Txn, term string, first int, entries []subtreeEntry) error {
	buf := []byte{'['}
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		buf = append(buf, ']')
		if err := tx.Put(subtreeKey(term, first+n-1), buf); err != nil {
			return err
		}
		first += n
		buf, n = []byte{'['}, 0
		return nil
	}
	for _, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if n == subtreePackEntries || n > 0 && len(buf)+len(b) > subtreePackBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, b...)
		n++
	}
	return flush()
}

// decodeSubtreePack decodes one key of the index: its entries and the
// sequence of the first.
func decodeSubtreePack(prefix, k, v []byte) (first int, entries []subtreeEntry, err error) {
	last, err := strconv.Atoi(string(k[len(prefix):]))
	if err != nil {
		return 0, nil, fmt.Errorf("supervisor: malformed subtree index key %q", k)
	}
	if len(v) > 0 && v[0] == '[' {
		err = json.Unmarshal(v, &entries)
	} else {
		entries = make([]subtreeEntry, 1)
		err = json.Unmarshal(v, &entries[0])
	}
	if err == nil && len(entries) == 0 {
		err = errors.New("an empty pack")
	}
	if err != nil {
		return 0, nil, fmt.Errorf("supervisor: decode %s: %w", k, err)
	}
	return last - len(entries) + 1, entries, nil
}

// readEntries reads up to limit entries of t's index from sequence from
// (no further than the index's length, Counts.Listed): the scan stops at
// the pack that holds the last, so that a backend that reads in pages
// (etcd) asks for no more than it must.
func readEntries(tx store.ReadTxn, t *Termination, from, limit int) ([]subtreeEntry, error) {
	limit = min(limit, t.Counts.Listed-from)
	if limit <= 0 {
		return nil, nil
	}
	out := make([]subtreeEntry, 0, limit)
	prefix := subtreePrefix(t.ID)
	next := from
	err := tx.Scan(prefix, subtreeKey(t.ID, from), func(k, v []byte) error {
		first, entries, err := subtreePacks.decode(prefix, k, v)
		if err != nil {
			return err
		}
		if first > next || first+len(entries) <= next {
			return fmt.Errorf("supervisor: the subtree index of termination %s has no entry %d (key %s)", t.ID, next, k)
		}
		entries = entries[next-first:]
		entries = entries[:min(len(entries), limit-len(out))]
		out = append(out, entries...)
		next += len(entries)
		if len(out) == limit {
			return store.ErrStopScan
		}
		return nil
	})
	return out, err
}

// entryNodes reads the nodes of entries (every entry's when all, else the
// members').
func entryNodes(tx store.ReadTxn, entries []subtreeEntry, all bool) (map[string]*tree.Node, error) {
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		if all || e.member() {
			ids = append(ids, e.Node)
		}
	}
	if err := store.Prefetch(tx, store.KeysOf(ids, tree.NodeKey), nil); err != nil {
		return nil, err
	}
	out := make(map[string]*tree.Node, len(ids))
	for _, id := range ids {
		n, err := tree.GetNodeIn(tx, id)
		if err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, nil
}

// readChunk reads up to limit entries of t's index from sequence from, and
// their nodes (every entry's when all, else the members').
func readChunk(tx store.ReadTxn, t *Termination, from, limit int, all bool) ([]subtreeEntry, map[string]*tree.Node, error) {
	entries, err := readEntries(tx, t, from, limit)
	if err != nil {
		return nil, nil, err
	}
	nodes, err := entryNodes(tx, entries, all)
	return entries, nodes, err
}

// ownedIn reads up to limit entries of t's index from sequence from, and
// the members among them whose node still names t. While t, as stored in
// tx, says no member has been taken over since the mark (MembersIntact),
// every member the index lists still names it, and no node is read.
func ownedIn(tx store.ReadTxn, t Termination, from, limit int) ([]subtreeEntry, []string, error) {
	var stored Termination
	if err := getTermination(tx, t.ID, &stored); err != nil {
		return nil, nil, err
	}
	if !stored.MembersIntact {
		entries, nodes, err := readChunk(tx, &t, from, limit, false)
		if err != nil {
			return nil, nil, err
		}
		return entries, owned(t, entries, nodes), nil
	}
	entries, err := readEntries(tx, &t, from, limit)
	var ids []string
	for _, e := range entries {
		if e.member() {
			ids = append(ids, e.Node)
		}
	}
	return entries, ids, err
}

// owned is the entries' members whose node still names t.
func owned(t Termination, entries []subtreeEntry, nodes map[string]*tree.Node) []string {
	var ids []string
	for _, e := range entries {
		if n := nodes[e.Node]; e.member() && n != nil && n.TerminationID == t.ID {
			ids = append(ids, e.Node)
		}
	}
	return ids
}

// membersIn lists the nodes t stops now, read in tx: its Members, or, for
// an Indexed termination, the index's members whose node still names it.
// It reads the whole subtree: for the steps that need every member at once
// (counting confirmations, a rollout batch's leases), not for the chunks.
func membersIn(tx store.ReadTxn, t Termination) ([]string, error) {
	if !t.Indexed {
		return t.Members, nil
	}
	var ids []string
	for from := 0; from < t.Counts.Listed; {
		entries, nodes, err := readChunk(tx, &t, from, DefaultChunkSize, false)
		if err != nil {
			return nil, err
		}
		if len(entries) == 0 {
			break
		}
		ids = append(ids, owned(t, entries, nodes)...)
		from += len(entries)
	}
	return ids, nil
}

// Members lists the nodes a termination stops now (see membersIn).
func (s *Supervisor) Members(ctx context.Context, t Termination) ([]string, error) {
	return store.Read(ctx, s.Store, func(tx store.ReadTxn) ([]string, error) { return membersIn(tx, t) })
}

// markChunk is one chunk of the mark, inside its transaction.
type markChunk struct {
	tx     store.Txn
	now    time.Time
	t      *Termination
	others map[string]*Termination    // the other terminations met, by id
	taken  map[string]map[string]bool // other termination → nodes taken from it
	// calls are the open calls of the chunk's nodes, and ended those
	// that ended on a termination's account and are in no record yet,
	// read together before the chunk discovers them
	// (ledger.OpenAndEndedCallsOf).
	calls, ended map[string][]*ledger.ToolCall
	// entries are the entries the chunk lists, from sequence first on,
	// stored packed when the chunk ends (putSubtreeEntries).
	first   int
	entries []subtreeEntry
	// wrote: the members' nodes as the chunk wrote them (nodeCache).
	wrote []*tree.Node
}

// mark marks the next chunk of the subtree (the roots first, then the
// children of the entries after the cursor, top down) and, when the whole
// subtree is listed, moves the termination on. A node another termination
// is stopping is taken over (with its open calls) when this one supersedes
// that one, or left to it; a node already terminated is listed with the
// termination that did it (ReachNode). Every node of the subtree gets
// exactly one entry.
func (s *Supervisor) mark(ctx context.Context, id string, now time.Time) error {
	return s.markWith(ctx, id, nil, now)
}

// markWith is mark given the termination as the caller read it (hint,
// nil: none): what the chunk will read that it names is asked for with
// the termination (markReads, planMark), one request on etcd where two or
// three went in turn.
func (s *Supervisor) markWith(ctx context.Context, id string, hint *Termination, now time.Time) error {
	var handedOver []string
	var members, listed int
	var done bool
	var mode Mode
	budget := s.chunkSize()
	plan, planned, err := s.planMark(ctx, id, hint, budget)
	if err != nil {
		return err
	}
	var wrote []*tree.Node
	var kept map[string]keptNode
	if plan != nil {
		// The nodes as the watch delivered them, taken before await
		// turns them into placeholders for this chunk's own writes.
		kept = s.nodes.kept(plan.kids)
		s.nodes.await(plan.kids)
		defer s.nodes.settle(plan.kids)
	}
	var advanced Termination // as the mark's last chunk wrote it
	attempts := 0
	err = s.Store.Update(ctx, func(tx store.Txn) error {
		handedOver, done, wrote, advanced = nil, false, nil, Termination{}
		attempts++
		if attempts == 1 && planned != nil {
			keys, scans := markReads(planned, plan, kept)
			if err := store.PrefetchReads(tx, keys, scans); err != nil {
				return err
			}
		}
		var t Termination
		if err := getTermination(tx, id, &t); err != nil {
			return err
		}
		if t.Phase != PhaseRequested {
			return nil
		}
		mode = t.Mode
		t.Indexed = true // a request stored before the index is listed here too
		c := &markChunk{tx: tx, now: now, t: &t, others: map[string]*Termination{}, taken: map[string]map[string]bool{}, first: t.Counts.Listed}
		if t.Cursor.Step != ActMark {
			// The roots, in one chunk (at most MaxTerminationRoots).
			t.Cursor = Cursor{Step: ActMark}
			t.MembersIntact = true
			t.CancelsOrderedAtMark = t.Mode == ModeAbort
			roots := t.RootIDs()
			keys, scans := rootsReads(roots)
			if err := store.PrefetchReads(tx, keys, scans); err != nil {
				return err
			}
			var err error
			// (The roots' lists of ended calls are read with their
			// nodes, before their holdings are known: a few ranges.)
			if c.calls, c.ended, err = ledger.OpenAndEndedCallsOf(tx, roots, roots); err != nil {
				return err
			}
			for i, r := range roots {
				if slices.Contains(roots[:i], r) {
					continue
				}
				n, err := tree.GetNodeIn(tx, r)
				if err != nil {
					return err
				}
				if err := c.discover(n); err != nil {
					return err
				}
				// Marked (or listed as another's): the state covers the
				// subtree from here on, not the request.
				if err := tree.ClearStopRequestedIn(tx, r, t.ID); err != nil {
					return err
				}
			}
		} else {
			// The walk read before this transaction, if it starts where
			// the mark stands (else another pass did this chunk: the
			// next pass plans afresh).
			if plan == nil || plan.from != t.Cursor {
				return nil
			}
			// On the first attempt the nodes the watch delivered are
			// checked by their revision at the commit, not read.
			var value func(string) (keptNode, bool)
			if attempts == 1 && len(kept) > 0 {
				value = func(id string) (keptNode, bool) { k, ok := kept[id]; return k, ok }
			}
			if err := c.list(plan.kids, plan.leaves, value); err != nil {
				return err
			}
			if t.Counts.Listed != plan.listed {
				return fmt.Errorf("supervisor: the mark listed %d nodes of termination %s where its walk planned %d", t.Counts.Listed, id, plan.listed)
			}
			t.Cursor = plan.to
		}
		if err := putSubtreeEntries(tx, id, c.first, c.entries); err != nil {
			return err
		}
		if _, expects := tx.(store.Expecter); expects {
			wrote = c.wrote // (kept only where the record checks them at its commit)
		}
		for oid, nodes := range c.taken {
			other := HandOver(*c.others[oid], nodes, t.ID, now)
			if err := kv.PutJSON(tx, terminationKey(oid), other); err != nil {
				return err
			}
			handedOver = append(handedOver, oid)
		}
		members, listed = t.Counts.Members, t.Counts.Listed
		t.UpdatedAt = now
		if t.Cursor.Entry < t.Counts.Listed {
			return kv.PutJSON(tx, terminationKey(id), t)
		}
		done = true
		advanced, err = putAdvancedAs(tx, t, ActMark, Progress{Unconfirmed: t.Counts.Members, CallsInFlight: t.Progress.CallsInFlight, CancelsPending: t.Progress.CancelsPending}, now)
		return err
	})
	if errors.Is(err, errChildNotesStale) {
		// Nothing was written: the next pass walks again, reading every
		// list.
		s.childNotesDistrusted.Store(true)
		s.Log.Warn("termination's mark found a node whose entry says it has no children, and its node that it may have some; reading every child list from now on", "termination_id", id)
		return nil
	}
	if err == nil {
		s.nodes.keep(wrote)
		s.keepAckDeadline(advanced)
	}
	if err == nil && done && members > 0 {
		s.Log.Info("termination marked the subtree", "termination_id", id, "mode", mode.String(), "nodes", members, "listed", listed)
	}
	for _, oid := range handedOver {
		s.Log.Info("termination took over nodes from another", "termination_id", id, "superseded_termination_id", oid)
		s.Kick(oid)
	}
	return err
}

// rootsReads is what the mark's first chunk reads of its roots: their
// nodes, their lists of open and of ended calls, and their stop requests.
func rootsReads(roots []string) (keys [][]byte, scans []store.ScanFrom) {
	keys = append(store.KeysOf(roots, tree.NodeKey), store.KeysOf(roots, tree.StopRequestedKey)...)
	for _, r := range roots {
		scans = append(scans, store.ScanFrom{Prefix: ledger.OpenCallPrefix(r)}, store.ScanFrom{Prefix: ledger.EndedOnPrefix(r)})
	}
	return keys, scans
}

// markReads is what a chunk of the mark reads that planned (the
// termination as its plan read it) names, with the termination: the
// roots' reads (rootsReads) for the first chunk, and for a later one the
// nodes of the plan's kids that are not kept (the others are checked at
// the commit, not read).
func markReads(planned *Termination, plan *markPlan, kept map[string]keptNode) (keys [][]byte, scans []store.ScanFrom) {
	keys = [][]byte{terminationKey(planned.ID)}
	switch {
	case planned.Phase != PhaseRequested:
	case planned.Cursor.Step != ActMark:
		k, sc := rootsReads(planned.RootIDs())
		keys, scans = append(keys, k...), sc
	case plan != nil && plan.from == planned.Cursor:
		for _, kid := range plan.kids {
			if _, ok := kept[kid]; !ok {
				keys = append(keys, tree.NodeKey(kid))
			}
		}
	}
	return keys, scans
}

// markPlan is the walk of the subtree index one chunk of the mark lists:
// from the cursor from, the children of each entry in order (the entries
// the walk lists expanded after the index's, as later chunks would), up
// to the chunk's budget of nodes; to is the cursor after them.
type markPlan struct {
	from, to Cursor
	kids     []string
	// listed is the index's length once the kids are listed.
	listed int
	// leaves are the kids whose child lists the walk did not read
	// because their entries in their parents' lists say they have no
	// child (tree.ChildMayHaveChildren); the chunk checks each against
	// its node's own note (list).
	leaves map[string]bool
}

// errChildNotesStale stops a mark's chunk whose walk skipped the child
// list of a node that may have children after all (its entry written as a
// leaf's, its child spawned by a binary without the child notes): the
// chunk writes nothing, and the walk is done again reading every list.
var errChildNotesStale = errors.New("supervisor: a child note says a node has no children, its node that it may have some")

// planMark reads, before the chunk's transaction, the children the next
// chunk of the mark lists (nil when the mark is not past its roots). The
// child lists are read outside the transaction that marks: the roots'
// chunk has committed, and from then on Spawn refuses every node of the
// subtree (an ancestor is stopping), so no child list of the subtree can
// change — reading them inside would only make etcd compare every list
// again at the commit. What can still change (a node's state, its open
// calls, the cursor) the transaction reads and guards itself. Entries the
// walk lists are expanded by it too, so a subtree of budget nodes is
// marked in one chunk after the roots', not one per level; the entries
// expanded are bounded (four times budget: leaves list nothing). A child
// list is read only of a node that may have children: as its entry in
// the index says (its node's HoldsChildren), or, for a node the walk
// listed itself, as its entry in its parent's list says (the child
// notes, tree.ChildMayHaveChildren), so the leaves of a level the walk
// lists and expands in one chunk cost no read.
//
// The termination is read first, and with it (hint: as the caller read
// it) the index from the hint's cursor, in one request on etcd. planned is
// the termination as read here (nil if none was).
func (s *Supervisor) planMark(ctx context.Context, id string, hint *Termination, budget int) (plan *markPlan, planned *Termination, err error) {
	err = s.Store.View(ctx, func(tx store.ReadTxn) error {
		plan, planned = nil, nil
		if hint != nil && hint.ID == id && hint.Phase == PhaseRequested && hint.Cursor.Step == ActMark && hint.Cursor.Entry < hint.Counts.Listed {
			if err := store.PrefetchReads(tx, [][]byte{terminationKey(id)}, []store.ScanFrom{{Prefix: subtreePrefix(id), Start: subtreeKey(id, hint.Cursor.Entry)}}); err != nil {
				return err
			}
		}
		var t Termination
		if err := getTermination(tx, id, &t); err != nil {
			return err
		}
		planned = &t
		if t.Phase != PhaseRequested || t.Cursor.Step != ActMark {
			return nil
		}
		p := &markPlan{from: t.Cursor, to: t.Cursor, listed: t.Counts.Listed}
		trustNotes := !s.childNotesDistrusted.Load()
		roots := t.RootIDs()
		var fresh []string // the nodes of the entries the walk lists, from t.Counts.Listed on
		// freshLeaf[i]: fresh[i]'s entry in its parent's list says it has
		// no child (tree.ChildMayHaveChildren): its list is not read.
		var freshLeaf []bool
		lastBatch, kidsBefore := 0, 0
		var indexed []subtreeEntry // the index's entries from indexFrom on
		indexFrom := 0
		for expanded := 0; len(p.kids) < budget && expanded < 4*budget && p.to.Entry < p.listed; {
			// As many parents as should fill the budget at the children
			// per parent the walk has found so far (this chunk's, else
			// the earlier chunks'), and an eighth more: the child lists
			// are read together, and each one read but not walked is
			// read again by the next chunk. At least an eighth of the
			// budget, and twice the last batch after one that found no
			// children, so that leaves cost a few requests, not one per
			// handful.
			batch := budget
			need := budget - len(p.kids)
			switch {
			case expanded > 0 && len(p.kids) > 0:
				batch = need * expanded / len(p.kids) * 9 / 8
			case expanded == 0 && t.Cursor.Entry > 0 && t.Counts.Listed > len(roots):
				batch = need * t.Cursor.Entry / (t.Counts.Listed - len(roots)) * 9 / 8
			}
			if lastBatch > 0 && len(p.kids) == kidsBefore {
				batch = max(batch, 2*lastBatch)
			}
			batch = min(max(batch, budget/8, 1), budget)
			lastBatch, kidsBefore = batch, len(p.kids)
			var parents []string
			// childless[i]: parents[i] has no child (its entry says it
			// never had one): its list is not read.
			var childless []bool
			if p.to.Entry < t.Counts.Listed {
				// The index's entries are read a chunk's worth at a time
				// (a pack is decoded whole), the batches taken from them.
				if p.to.Entry < indexFrom || p.to.Entry >= indexFrom+len(indexed) {
					entries, err := readEntries(tx, &t, p.to.Entry, budget)
					if err != nil {
						return err
					}
					indexFrom, indexed = p.to.Entry, entries
				}
				off := p.to.Entry - indexFrom
				for _, e := range indexed[off:min(len(indexed), off+batch)] {
					parents = append(parents, e.Node)
					childless = append(childless, !e.Holds.May(tree.HoldsChildren))
				}
			} else {
				off := p.to.Entry - t.Counts.Listed
				parents = fresh[off:min(len(fresh), off+batch)]
				if trustNotes {
					childless = freshLeaf[off : off+len(parents)]
				} else {
					childless = make([]bool, len(parents))
				}
			}
			if len(parents) == 0 {
				break // (an index shorter than its count)
			}
			scans := make([]store.ScanFrom, len(parents))
			var read []store.ScanFrom
			for i, parent := range parents {
				scans[i] = store.ScanFrom{Prefix: tree.ChildPrefix(parent)}
				if i == 0 && p.to.After != "" {
					scans[0].Start = append(tree.ChildKey(parents[0], p.to.After), 0)
				}
				if !childless[i] {
					read = append(read, scans[i])
				}
			}
			if err := store.PrefetchScansFrom(tx, read); err != nil {
				return err
			}
			base, full := p.to.Entry, false
			for i, sc := range scans {
				if childless[i] {
					if base+i >= t.Counts.Listed { // (a kid the walk listed: its note said so)
						if p.leaves == nil {
							p.leaves = map[string]bool{}
						}
						p.leaves[parents[i]] = true
					}
					p.to.Entry, p.to.After = base+i+1, ""
					expanded++
					continue
				}
				err := tx.Scan(sc.Prefix, sc.Start, func(k, v []byte) error {
					if len(p.kids) == budget {
						full = true
						return store.ErrStopScan
					}
					kid := string(k[len(sc.Prefix):])
					p.kids = append(p.kids, kid)
					p.to.Entry, p.to.After = base+i, kid
					if len(roots) == 1 || !slices.Contains(roots, kid) {
						fresh = append(fresh, kid)
						freshLeaf = append(freshLeaf, !tree.ChildMayHaveChildren(v))
						p.listed++
					}
					return nil
				})
				if err != nil {
					return err
				}
				if full {
					break
				}
				p.to.Entry, p.to.After = base+i+1, ""
				expanded++
			}
			if full {
				break
			}
		}
		plan = p
		return nil
	})
	return plan, planned, err
}

// list lists, marks and appends the kids (a plan's), in order.
//
// Their nodes are read first, then the open calls of those that may have
// some (tree.HoldsCalls): a node that never began a call has none, and a
// call that begins before this chunk commits notes the node in its own
// transaction, so the node's read here, which the commit guards, fails
// the chunk; one that begins after finds the node stopping. Likewise
// their calls that ended on a stop's account and are in no record yet are
// read only of the nodes that may have some (tree.HoldsEndedCalls, noted
// by the mark that puts a node's calls on its account, and by the ledger
// when a call ends under a stop requested and not marked at its node).
//
// A kid the walk did not expand because its entry said it has no child
// (leaves) must say the same on its node, as the spawn of its first child
// notes both in one transaction; else the chunk stops (errChildNotesStale)
// before it marks anything.
func (c *markChunk) list(kids []string, leaves map[string]bool, value func(string) (keptNode, bool)) error {
	t, tx := c.t, c.tx
	roots := t.RootIDs()
	if len(roots) > 1 {
		// A root inside another root's subtree: listed as a root.
		kids = slices.DeleteFunc(slices.Clone(kids), func(kid string) bool { return slices.Contains(roots, kid) })
	}
	// Read, or taken as the watch delivered them (value) and checked at
	// the commit (nodeCache).
	got, err := nodesFrom(tx, kids, value != nil, value)
	if err != nil {
		return fmt.Errorf("supervisor: the mark's nodes: %w", err)
	}
	nodes := make([]*tree.Node, 0, len(kids))
	var withCalls, withEnded []string
	for _, kid := range kids {
		n := got[kid]
		if n == nil {
			return fmt.Errorf("supervisor: child index names %s: %w", kid, store.ErrNotFound)
		}
		if leaves[kid] && n.Holds.May(tree.HoldsChildren) {
			return errChildNotesStale
		}
		nodes = append(nodes, n)
		if n.Holds.May(tree.HoldsCalls) {
			withCalls = append(withCalls, kid)
		}
		if n.Holds.May(tree.HoldsEndedCalls) {
			withEnded = append(withEnded, kid)
		}
	}
	if c.calls, c.ended, err = ledger.OpenAndEndedCallsOf(tx, withCalls, withEnded); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := c.discover(n); err != nil {
			return err
		}
	}
	return nil
}

// discover lists one node of the subtree and, unless another termination
// accounts for it, marks it and stamps its open calls.
func (c *markChunk) discover(n *tree.Node) error {
	t, tx := c.t, c.tx
	if n.TerminationID == t.ID && n.State != tree.NodeStateRunning {
		return nil // already listed (only a repeated root can get here)
	}
	var owner Termination
	if n.State != tree.NodeStateRunning && n.TerminationID != "" {
		o, ok := c.others[n.TerminationID]
		if !ok {
			o = &Termination{}
			if err := getTermination(tx, n.TerminationID, o); err != nil {
				return err
			}
			c.others[n.TerminationID] = o
		}
		owner = *o
	}
	reach := ReachNode(*t, n.State, owner)
	if reach == ReachPrior && owner.ID != "" && owner.Phase != PhaseTerminated {
		// Terminated by a termination still writing its record (chunk by
		// chunk): that one accounts for it.
		reach = ReachLeave
	}
	// What it may hold is final from here on: a node that is not running
	// is given no grant, privilege, call or child.
	e := subtreeEntry{Node: n.NodeID, Reach: reach, Holds: n.Holds}
	switch reach {
	case ReachPrior:
		rid, err := recordIDOf(tx, owner.ID)
		if err != nil {
			return err
		}
		e.Other, e.Record = owner.ID, rid
		t.Counts.Prior++
	case ReachLeave:
		e.Other = owner.ID
		t.Counts.HandedOver++
		t.SupersededBy = noteNamed(t.SupersededBy, owner.ID)
	case ReachTakeOver:
		e.Other, e.State = owner.ID, tree.StateName(n.State)
		if slices.Contains(t.RootIDs(), n.NodeID) {
			*t = InheritAtRoot(*t, owner)
		} else {
			*t = Inherit(*t, owner)
		}
		t.Counts.TakenOver++
		t.TookOverFrom = noteNamed(t.TookOverFrom, owner.ID)
		if c.taken[owner.ID] == nil {
			c.taken[owner.ID] = map[string]bool{}
		}
		c.taken[owner.ID][n.NodeID] = true
	}
	c.entries = append(c.entries, e)
	t.Counts.Listed++
	if !e.member() {
		return nil
	}
	t.Counts.Members++
	// An exited node keeps its state (it may not act, and the record
	// weighs its exit); every other node stops.
	if n.State != tree.NodeStateExited {
		n.State = MarkedState(*t, n.State)
	}
	n.TerminationID = t.ID
	// When it first came under a stop, kept through every take-over:
	// its holder's word from then on is its claim under stop.
	n.StopSince = t.StopSinceAt(n.StopSince, owner, reach == ReachTakeOver, c.now)
	if len(c.calls[n.NodeID]) > 0 || len(c.ended[n.NodeID]) > 0 {
		// Its calls are put on this termination's account below, and
		// each that ends is noted by node until the record lists it
		// (ledger.MoveEndedIn, and the ledger's end of a call): a later
		// mark reads the note only of a node that says so.
		n.Holds = n.Holds.With(tree.HoldsEndedCalls)
	}
	if err := tree.PutNodeIn(tx, n); err != nil {
		return err
	}
	c.wrote = append(c.wrote, n)
	for _, call := range c.ended[n.NodeID] {
		// A call that ended after this termination's request, on the
		// account of another that has not listed it (one requested that
		// had not marked the node, or the one this takes the node over
		// from), was in flight when this one was requested: this one
		// accounts for the node, and lists it, as it lists the open ones
		// below.
		if !call.EndedAt.Before(t.RequestedAt) {
			if err := ledger.MoveEndedIn(tx, call, t.ID); err != nil {
				return err
			}
		}
	}
	for _, call := range c.calls[n.NodeID] {
		if reach == ReachTakeOver && call.TerminationID != "" {
			// The call moves to this termination's account (a cancel
			// order already sent stands): each call is accounted for by
			// exactly one termination.
			if err := tx.Delete(ledger.TermCallKey(call.TerminationID, call.CallID)); err != nil {
				return err
			}
		}
		call.TerminationID = t.ID
		if err := ledger.PutCallIn(tx, call); err != nil {
			return err
		}
		if err := tx.Put(ledger.TermCallKey(t.ID, call.CallID), nil); err != nil {
			return err
		}
		// An aborting node's calls are ordered cancelled in the
		// transaction that marks it: whoever sees the node aborting (the
		// agent, on its signals) finds its calls' cancel orders already
		// there, so a gate that ends a call the agent gave up on reports a
		// cancelled call, not a failed one. The cancel step finds them
		// ordered and moves on.
		if n.State == tree.NodeStateAborting && call.State == ledger.CallStateInFlight {
			if err := ledger.RequestCancelIn(tx, call, t.ID, c.now); err != nil {
				return err
			}
		}
		// Each shown at once, before the next observation: a cancel
		// ordered now, or with the node taken over, holds a drain open as
		// a call in flight does (Next).
		switch call.State {
		case ledger.CallStateCancelRequested:
			t.Progress.CancelsPending++
		case ledger.CallStateInFlight:
			t.CancelsOrderedAtMark = false // the cancel step orders it
			t.Progress.CallsInFlight++
		}
	}
	return nil
}

// termCallsAfter lists up to limit ids of the calls t accounts for after
// the call id after, and whether there are more.
func termCallsAfter(tx store.ReadTxn, term, after string, limit int) ([]string, bool, error) {
	ids, more, err := store.IDsAfter(tx, ledger.TermCallPrefix(term), after, limit)
	if err != nil {
		return nil, false, err
	}
	return ids, more, store.Prefetch(tx, store.KeysOf(ids, ledger.CallKey), nil)
}

// cancelCalls does one chunk of an escalation (the members' nodes go from
// draining to aborting: the sessions abort now) or of the cancel orders
// (one per in-flight call the termination accounts for; gates watching
// their orders get them at once), and advances when both are done.
func (s *Supervisor) cancelCalls(ctx context.Context, t Termination, action Action, p Progress, now time.Time) error {
	budget := s.chunkSize()
	// An escalation's entries are read before its transaction, as the
	// record's are: an entry never changes once the mark wrote it, and the
	// cursor the transaction reads says which are still to do.
	var entries []subtreeEntry
	if action == ActEscalate {
		from := 0
		if t.Cursor.Step == action {
			from = t.Cursor.Entry
		}
		var err error
		if entries, err = store.Read(ctx, s.Store, func(tx store.ReadTxn) ([]subtreeEntry, error) {
			return readEntries(tx, &t, from, budget)
		}); err != nil {
			return err
		}
	}
	// (When the termination moved on, or another pass did this chunk, it
	// is read again.)
	var advanced Termination // as the step's last chunk wrote it
	err := s.inChunk(ctx, t, phaseMoved, func(tx store.Txn, stored Termination) error {
		advanced = Termination{}
		if stored.Cursor.Step != action {
			stored.Cursor = Cursor{Step: action}
		}
		cur := &stored.Cursor
		stored.UpdatedAt = now
		if action == ActEscalate && cur.Entry < stored.Counts.Listed {
			nodes, err := entryNodes(tx, entries, false)
			if err != nil {
				return err
			}
			for _, id := range owned(stored, entries, nodes) {
				if n := nodes[id]; n.State == tree.NodeStateDraining {
					n.State = tree.NodeStateAborting
					if err := tree.PutNodeIn(tx, n); err != nil {
						return err
					}
					// As the mark does for an abort: the node's calls are
					// ordered cancelled as it turns aborting (a node that
					// never began one has none).
					if !n.Holds.May(tree.HoldsCalls) {
						continue
					}
					calls, err := ledger.OpenCallsIn(tx, id)
					if err != nil {
						return err
					}
					for _, c := range calls {
						if c.TerminationID == t.ID {
							if err := ledger.RequestCancelIn(tx, c, t.ID, now); err != nil {
								return err
							}
						}
					}
				}
			}
			cur.Entry += max(1, len(entries))
			return kv.PutJSON(tx, terminationKey(t.ID), stored)
		}
		if action == ActCancelCalls && stored.CancelsOrderedAtMark {
			// The mark ordered every cancel there is to order.
			var err error
			advanced, err = putAdvancedAs(tx, stored, action, p, now)
			return err
		}
		// The calls the termination accounts for (stamped by the mark, or
		// taken over with their nodes): no call can begin after the mark.
		ids, more, err := termCallsAfter(tx, stored.ID, cur.After, budget)
		if err != nil {
			return err
		}
		for _, cid := range ids {
			c, err := ledger.GetCallIn(tx, cid)
			if err != nil {
				return err
			}
			if err := ledger.RequestCancelIn(tx, c, t.ID, now); err != nil {
				return err
			}
		}
		if more {
			cur.After = ids[len(ids)-1]
			return kv.PutJSON(tx, terminationKey(t.ID), stored)
		}
		advanced, err = putAdvancedAs(tx, stored, action, p, now)
		return err
	})
	if err == nil {
		// (An escalation enters aborting with its deadline.)
		s.keepAckDeadline(advanced)
	}
	return err
}

// revoke revokes, chunk by chunk, the members' grants, starts revoking
// their privileges and cancels their leases, then records that it did. Each
// part is idempotent, so a crash in a chunk repeats only that chunk.
func (s *Supervisor) revoke(ctx context.Context, t Termination, p Progress, now time.Time) error {
	if t.Revoked {
		return s.advance(ctx, t, ActRevoke, p, now)
	}
	cur := t.Cursor
	if cur.Step != ActRevoke {
		cur = Cursor{Step: ActRevoke}
	}
	deadline := t.HookDeadline
	if deadline.IsZero() {
		deadline = t.HookDeadlineFrom(now)
	}
	// A revocation that began with the held index lists what each chunk's
	// members hold there (one begun before it goes on without).
	indexing := t.Cursor.Step != ActRevoke || t.HeldIndexed
	var ids, withGrants, withPrivs []string
	var privs []privilege.Privilege
	seqOf := map[string]int{}
	read := 0
	if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		// The index from the cursor with the termination (ownedIn): one
		// request on etcd where two went in turn.
		if cur.Entry < t.Counts.Listed {
			if err := store.PrefetchReads(tx, [][]byte{terminationKey(t.ID)}, []store.ScanFrom{{Prefix: subtreePrefix(t.ID), Start: subtreeKey(t.ID, cur.Entry)}}); err != nil {
				return err
			}
		}
		entries, members, err := ownedIn(tx, t, cur.Entry, s.chunkSize())
		if err != nil {
			return err
		}
		ids, read = members, max(1, len(entries))
		holds := make(map[string]tree.Holdings, len(entries))
		for i, e := range entries {
			seqOf[e.Node] = cur.Entry + i
			holds[e.Node] = e.Holds
		}
		// Only the members that may hold a grant or a privilege (as the
		// mark found their nodes: a marked node is given none) are read
		// for them, not a range each per member.
		withGrants = mayHold(ids, holds, tree.HoldsGrants)
		privs = nil
		if withPrivs = mayHold(ids, holds, tree.HoldsPrivileges); indexing && len(withPrivs) > 0 {
			privs, err = privilege.PrivilegesIn(tx, withPrivs)
		}
		return err
	}); err != nil {
		return err
	}
	var grants []HeldGrant
	if len(ids) > 0 {
		by := "termination:" + t.ID
		reason := t.finalReason()
		if s.Grants != nil && len(withGrants) > 0 {
			var err error
			if grants, err = s.Grants.RevokeHeldBy(ctx, withGrants, by, reason); err != nil {
				return fmt.Errorf("revoke grants: %w", err)
			}
		}
		// Privileges are revoked off this path, in parallel and within
		// the termination's hook deadline.
		if s.Privileges != nil {
			// The chunk's start is stored before its first hook is
			// called, with the hook deadline: a restart before the
			// chunk commits runs it again, and a privilege live when
			// its hook was first called is called again, not decided
			// expired on the declared expiry that passed meanwhile
			// (until the fortieth pass it was), nor given a new
			// deadline.
			// A chunk whose start was stored already runs again (a
			// restart before it committed): an earlier process may have
			// called its hooks, and one not called now is not "never
			// called" (privilege.Privileges.NotCalled).
			rerun := !cur.RevokeBegan.IsZero()
			if cur.RevokeBegan.IsZero() && (indexing && privilege.Pending(privs) > 0 || !indexing && len(withPrivs) > 0) {
				began := cur
				began.RevokeBegan = now.Round(0).UTC() // as stored: inChunk compares cursors
				stored := false
				if err := s.inChunk(ctx, t, phaseMoved, func(tx store.Txn, st Termination) error {
					st.Cursor, st.HookDeadline, st.UpdatedAt = began, deadline, now
					st.HeldIndexed = st.HeldIndexed || indexing
					stored = true
					return kv.PutJSON(tx, terminationKey(t.ID), st)
				}); err != nil || !stored {
					return err // (moved on: read again)
				}
				cur, t.Cursor, t.HookDeadline, t.HeldIndexed = began, began, deadline, t.HeldIndexed || indexing
			}
			kick := func() { s.Kick(t.ID) }
			var err error
			if indexing {
				err = s.Privileges.DispatchReadBegun(ctx, privs, cur.RevokeBegan, deadline, rerun, kick)
			} else {
				err = s.Privileges.DispatchBegun(ctx, ids, cur.RevokeBegan, deadline, rerun, kick)
			}
			if err != nil {
				return fmt.Errorf("revoke privileges: %w", err)
			}
		}
		// A rollout batch leaves its leases to the rollout, which hands
		// them over to the replacements with generation + 1.
		if s.Leases != nil && !t.LeaseHandover {
			if err := s.Leases.CancelHeldBy(ctx, ids, reason); err != nil {
				return fmt.Errorf("cancel leases: %w", err)
			}
		}
	}
	cur.Entry += read
	cur.RevokeBegan = time.Time{}
	// The chunk's members may hold any number of grants (an agent delegates
	// to its child a request each): their held index goes in pages, all but
	// the last in transactions of their own, each guarded as the chunk is
	// (its keys are the same however often it runs), and the last with the
	// cursor.
	var index []heldItem
	if indexing {
		index = make([]heldItem, 0, len(grants)+len(privs))
		for _, g := range grants {
			index = append(index, heldItem{kind: heldGrant, seq: seqOf[g.NodeID], id: g.GrantID, node: g.NodeID})
		}
		for _, p := range privs {
			index = append(index, heldItem{kind: heldPrivilege, seq: seqOf[p.NodeID], id: p.ID, node: p.NodeID})
		}
	}
	pages := heldPages(t.ID, index, s.pageBytes())
	for _, page := range pages[:len(pages)-1] {
		if err := s.inChunk(ctx, t, phaseMoved, func(tx store.Txn, _ Termination) error { return putHeld(tx, t.ID, page) }); err != nil {
			return err
		}
	}
	return s.inChunk(ctx, t, phaseMoved, func(tx store.Txn, stored Termination) error {
		stored.HookDeadline = deadline
		stored.UpdatedAt = now
		if indexing {
			stored.HeldIndexed = true
			if err := putHeld(tx, t.ID, pages[len(pages)-1]); err != nil {
				return err
			}
		}
		if cur.Entry < stored.Counts.Listed {
			stored.Cursor = cur
			return kv.PutJSON(tx, terminationKey(t.ID), stored)
		}
		return putAdvanced(tx, stored, ActRevoke, p, now)
	})
}

// writeRecord writes the reconciliation record in parts, one transaction
// each: the members' entries chunk by chunk (each chunk terminates its
// nodes in the same transaction), then the calls, then the header, which
// makes the record visible and terminates the termination. The first of
// them also starts the record (its id, in the cursor), and the calls' last
// chunk writes the header with them — or the nodes' last chunk writes the
// calls and the header, when the calls fit beside it (all of them within
// a chunk and a page). Every step is guarded by the cursor,
// so exactly one record exists however often this runs; a record without
// its header (a crash in the middle) is never read.
func (s *Supervisor) writeRecord(ctx context.Context, t Termination, p Progress, now time.Time) error {
	start := t.Cursor.Step != ActWriteRecord
	switch cur := t.Cursor; {
	case !start && cur.GrantsPending:
		return s.recordGrants(ctx, t, now)
	case !start && cur.LeasesPending:
		return s.recordLeases(ctx, t, now)
	case start && t.Counts.Listed > 0 || !start && cur.Entry < t.Counts.Listed:
		return s.recordNodes(ctx, t, start, p, now)
	case start || !cur.CallsDone:
		return s.recordCalls(ctx, t, start, p, now)
	default:
		var written *ReconciliationRecord
		var unaccounted int
		err := s.inChunk(ctx, t, nil, func(tx store.Txn, stored Termination) error {
			var err error
			written, unaccounted, err = finishRecord(tx, stored, p, now)
			return err
		})
		s.recordWritten(t, written, unaccounted, err)
		return err
	}
}

// recordViewReads is what the View of a chunk of the record's nodes
// reads that t (the termination as the pass read it) names: the
// termination, its subtree index from the cursor, and the held index's
// privileges and grants from there (ownedIn, readHeld).
func recordViewReads(t Termination) (keys [][]byte, scans []store.ScanFrom) {
	from := t.Cursor.Entry
	keys = [][]byte{terminationKey(t.ID)}
	if from < t.Counts.Listed {
		scans = append(scans, store.ScanFrom{Prefix: subtreePrefix(t.ID), Start: subtreeKey(t.ID, from)})
	}
	if t.HeldIndexed {
		scans = append(scans, heldScanFrom(t.ID, heldPrivilege, from), heldScanFrom(t.ID, heldGrant, from))
	}
	return keys, scans
}

// recordTxnReads is what the transaction of that chunk reads that t
// names, beside the termination (inChunkReading asks for it): the
// record's key when the chunk starts the record (start; startRecord), the
// privileges held from the cursor (membersPrivileges), and the calls the
// termination accounts for when the chunk is the last (last;
// callsBesideLastChunk).
func recordTxnReads(t Termination, start, last bool) (keys [][]byte, scans []store.ScanFrom) {
	from := t.Cursor.Entry
	if start {
		from = 0 // startRecord's cursor
		keys = append(keys, recordByTermKey(t.ID))
	}
	if t.HeldIndexed {
		scans = append(scans, heldScanFrom(t.ID, heldPrivilege, from))
	}
	if last {
		scans = append(scans, store.ScanFrom{Prefix: ledger.TermCallPrefix(t.ID)})
	}
	return keys, scans
}

// startRecord starts the record in the transaction of its first part (its
// guard: the chunk runs only while the termination is reconciling, or
// superseded, and has no record yet).
func startRecord(tx store.Txn, stored *Termination) error {
	if notReconciling(stored, nil) {
		return errRecordNotDue
	}
	if _, err := tx.Get(recordByTermKey(stored.ID)); err == nil {
		return fmt.Errorf("supervisor: termination %s already has a record", stored.ID)
	}
	stored.Cursor = Cursor{Step: ActWriteRecord, RecordID: newRecordID()}
	return nil
}

// errRecordNotDue stops a record's first chunk when the termination moved
// on meanwhile (the next pass reads it again); the chunk commits nothing.
var errRecordNotDue = errors.New("supervisor: the record is not due")

// recordChunk is inChunk for the record's parts: the first one (start)
// also starts the record, and does nothing when the termination moved
// on.
func (s *Supervisor) recordChunk(ctx context.Context, t Termination, start bool, chunk func(tx store.Txn, stored Termination) error) error {
	return s.recordChunkReading(ctx, t, start, nil, nil, chunk)
}

// recordChunkReading is recordChunk asking for keys and scans with the
// termination (inChunkReading).
func (s *Supervisor) recordChunkReading(ctx context.Context, t Termination, start bool, keys [][]byte, scans []store.ScanFrom, chunk func(tx store.Txn, stored Termination) error) error {
	err := s.inChunkReading(ctx, t, nil, keys, scans, func(tx store.Txn, stored Termination) error {
		if start {
			if err := startRecord(tx, &stored); err != nil {
				return err
			}
		}
		return chunk(tx, stored)
	})
	if errors.Is(err, errRecordNotDue) {
		return nil
	}
	return err
}

// recordNodes writes the next chunk of the record's nodes with their
// privileges and leases, and terminates the members among them. The last
// chunk writes the calls and the header with them when nothing else is
// pending and the calls fit (callsBesideLastChunk).
func (s *Supervisor) recordNodes(ctx context.Context, t Termination, start bool, p Progress, now time.Time) error {
	budget := s.chunkSize()
	var ids []string
	var held []heldItem
	var entries []subtreeEntry
	if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		// What the termination as the pass read it names (its index and
		// its held index from the cursor), with the termination: one
		// request on etcd where four went in turn (recordReads).
		keys, scans := recordViewReads(t)
		if err := store.PrefetchReads(tx, keys, scans); err != nil {
			return err
		}
		var err error
		entries, ids, err = ownedIn(tx, t, t.Cursor.Entry, budget)
		if err != nil {
			return err
		}
		held = nil
		if t.HeldIndexed && len(entries) > 1 {
			// The chunk's registered privileges are listed (and those that
			// never answered decided) in its one transaction: it ends
			// before the entry that would take them past a page, so a
			// chunk of nodes that each filled their slots fits (a node
			// holds a bounded number, privilege.Privileges.MaxPerNode).
			items, err := readHeld(tx, t.ID, heldPrivilege, t.Cursor.Entry, t.Cursor.Entry+len(entries))
			if err != nil {
				return err
			}
			pids := make([]string, len(items))
			for i, it := range items {
				pids[i] = it.id
			}
			privs, err := privilege.ByID(tx, pids)
			if err != nil {
				return err
			}
			if k := privilegeCut(items, privs, t.Cursor.Entry, len(entries), s.pageBytes()); k < len(entries) {
				entries = entries[:k]
				kept := make(map[string]bool, k)
				for _, e := range entries {
					kept[e.Node] = true
				}
				ids = slices.DeleteFunc(ids, func(id string) bool { return !kept[id] })
			}
		}
		if t.HeldIndexed && len(ids) > 0 {
			held, err = readHeld(tx, t.ID, heldGrant, t.Cursor.Entry, t.Cursor.Entry+len(entries))
			held = heldOf(held, setOf(ids))
		}
		return err
	}); err != nil {
		return err
	}
	var leases []RecordLease
	var fetched leasesRead
	var grants []HeldGrant
	var err error
	if len(ids) > 0 {
		if leases, fetched, err = s.membersLeases(ctx, t, ids, ""); err != nil {
			return err
		}
		if grants, err = s.grantsHeld(ctx, t, held, ids); err != nil {
			return err
		}
	}
	all := make([]string, len(entries))
	for i, e := range entries {
		all[i] = e.Node
	}
	attempts := 0
	var terminated []string
	var written *ReconciliationRecord
	var recordUnaccounted int
	// The transaction's reads the termination names: the record's key
	// (for the first chunk), the privileges held from the cursor, and,
	// for the last chunk, the calls the termination accounts for
	// (callsBesideLastChunk).
	keys, scans := recordTxnReads(t, start, t.Cursor.Entry+len(entries) >= t.Counts.Listed)
	// The children of the members whose bare claim the control plane
	// would corroborate, read apart (childrenAlive) when the transaction
	// finds such members whose children it has not been given.
	children := childrenRead{alive: map[string]aliveBelow{}, read: map[string]bool{}}
	for round := 0; ; round++ {
		children.need, children.last = nil, round >= maxChildrenRounds
		err = s.recordNodesTxn(ctx, t, start, p, now, budget, keys, scans, entries, all, grants, leases, fetched, &children, &attempts, &terminated, &written, &recordUnaccounted)
		if !errors.Is(err, errChildrenNeeded) {
			break
		}
		if err = s.childrenAlive(ctx, children.need, &children); err != nil {
			break
		}
	}
	if err == nil {
		s.nodes.forget(terminated)
		if s.Privileges != nil {
			s.Privileges.Forget(terminated) // their record is written
		}
	}
	s.recordWritten(t, written, recordUnaccounted, err)
	return err
}

// maxChildrenRounds bounds the rounds of a record's chunk that read
// members' children apart (a member's claim corroborated between two
// rounds asks for another); the last weighs a member whose children were
// not read against the nodes in the chunk only, and one with none at work
// there as unread (tree.Beside.DescendantsUnread): not corroborated.
const maxChildrenRounds = 3

// errChildrenNeeded ends a record chunk's transaction, committing
// nothing, when members' children must be read first (childrenRead.need).
var errChildrenNeeded = errors.New("supervisor: the members' children are read first")

// childrenRead is what a record chunk knows of its members' children: the
// members whose children were read (read) and a child of each the control
// plane saw alive (alive), and, from the transaction, the members whose
// children it needs (need). On the last round, inChunk is a live node of
// the chunk below each node that has one, collected once per transaction.
type childrenRead struct {
	alive   map[string]aliveBelow
	read    map[string]bool
	need    []string
	last    bool
	inChunk map[string]*tree.Node
	// steps counts the nodes and ancestors the last round looked at (a
	// test reads it: the cost bound).
	steps int
}

// aliveChild returns a descendant of n that the control plane sees
// alive, for a member whose bare claim would be corroborated: from the
// descendants read apart (childrenAlive), else from the chunk's nodes (on
// the last round; all is their order; none there: its descendants
// unread), else it notes n as needing its descendants read and returns
// nothing.
func (c *childrenRead) aliveChild(n *tree.Node, nodes map[string]*tree.Node, all []string) aliveBelow {
	if !n.Holds.May(tree.HoldsChildren) {
		return aliveBelow{}
	}
	if c.read[n.NodeID] {
		return c.alive[n.NodeID]
	}
	if !c.last {
		c.need = append(c.need, n.NodeID)
		return aliveBelow{}
	}
	if c.inChunk == nil {
		// Once per transaction, not once per member that asks: each
		// claiming member scanned the whole chunk until the thirty-second
		// pass (members × nodes × depth steps).
		c.inChunk = map[string]*tree.Node{}
		for _, id := range all {
			m := nodes[id]
			c.steps++
			if m == nil {
				continue
			}
			if _, _, ok := tree.ChildAlive([]*tree.Node{m}); !ok {
				continue
			}
			c.steps += len(m.Ancestors)
			for _, a := range m.Ancestors {
				if _, ok := c.inChunk[a]; !ok {
					c.inChunk[a] = m
				}
			}
		}
	}
	if d := c.inChunk[n.NodeID]; d != nil {
		return aliveBelow{node: d}
	}
	// Not read, and nothing at work among the chunk's nodes: one outside
	// the chunk may be (until the thirty-second pass, the member's claim
	// read corroborated).
	return aliveBelow{unread: true}
}

// aliveBelow is what a record found at work below a member: a descendant
// with a session or a stream open (node), or else a descendant's call
// still open (call), or neither.
type aliveBelow struct {
	node   *tree.Node
	call   *tree.CallInFlight
	unread bool
}

// beside is what was found, as tree.JudgeExitBeside weighs it.
func (a aliveBelow) beside(b tree.Beside) tree.Beside {
	if a.node != nil {
		b.Descendants = []*tree.Node{a.node}
	}
	b.DescendantCall, b.DescendantsUnread = a.call, a.unread
	return b
}

func (a aliveBelow) found() bool { return a.node != nil || a.call != nil }

// recordNodesTxn is recordNodes' transaction.
func (s *Supervisor) recordNodesTxn(ctx context.Context, t Termination, start bool, p Progress, now time.Time, budget int, keys [][]byte, scans []store.ScanFrom,
	entries []subtreeEntry, all []string, grants []HeldGrant, leases []RecordLease, fetched leasesRead, children *childrenRead,
	attempts *int, terminated *[]string, written **ReconciliationRecord, recordUnaccounted *int) error {
	return s.recordChunkReading(ctx, t, start, keys, scans, func(tx store.Txn, stored Termination) error {
		cur := &stored.Cursor
		*terminated, *written = nil, nil
		children.need, children.inChunk = children.need[:0], nil
		// The entries as read before this transaction: an entry never
		// changes once the mark wrote it, and the cursor (read here, and
		// the same) says the chunk is still to do; reading them again
		// here would make etcd compare each of them at the commit. Their
		// nodes as the mark wrote them, when kept and on the first
		// attempt, are checked at the commit instead of read
		// (nodecache.go).
		*attempts++
		nodes, err := s.nodes.nodesIn(tx, all, *attempts == 1)
		if err != nil {
			return err
		}
		// Grants and leases were listed before this transaction: keep
		// those of the members still this termination's (another may have
		// taken some over since), so each is in exactly one record.
		members := owned(stored, entries, nodes)
		grants, leases := heldByOnly(members, grants, leases)
		// At most a page of the grants, or of the leases after all the
		// grants: the rest follow in parts of their own (recordGrants,
		// then recordLeases), the cursor saying where. Every grant still
		// judges its holder's exit here.
		listed, moreGrants := grantPage(grants, "", s.pageBytes())
		if moreGrants {
			cur.GrantsPending, cur.GrantsAfter = true, listed[len(listed)-1].GrantID
			cur.LeasesPending, cur.LeasesFrom, cur.LeasesAfter = true, cur.Entry, ""
			leases = nil
		} else {
			var more bool
			leases, more = leasePage(leases, "", s.pageBytes())
			if more || fetched.more {
				cur.LeasesPending, cur.LeasesFrom, cur.LeasesAfter = true, cur.Entry, fetched.after(leases)
			}
		}
		privs, err := membersPrivileges(tx, stored, cur.Entry, len(entries), members)
		if err != nil {
			return err
		}
		if privs, err = decideUnansweredPrivileges(tx, stored, privs, now, s.Privileges); err != nil {
			return err
		}
		part, unaccounted, err := recordPart(tx, stored, entries, nodes, grants, listed, privs, leases, func(n *tree.Node) aliveBelow { return children.aliveChild(n, nodes, all) })
		if err != nil {
			return err
		}
		if len(children.need) > 0 {
			return errChildrenNeeded
		}
		for _, m := range members {
			n := nodes[m]
			n.State = tree.NodeStateTerminated
			if err := tree.PutNodeIn(tx, n); err != nil {
				return err
			}
		}
		*terminated = all
		if cur.Parts, err = putRecordParts(tx, cur.RecordID, cur.Parts, part); err != nil {
			return err
		}
		cur.Entry += max(1, len(entries))
		cur.Unaccounted += unaccounted
		stored.UpdatedAt = now
		if cur.Entry >= stored.Counts.Listed && !cur.GrantsPending && !cur.LeasesPending {
			done, err := callsBesideLastChunk(tx, &stored, budget, s.pageBytes(), now, s.Ledger)
			if err != nil {
				return err
			}
			if done {
				*written, *recordUnaccounted, err = finishRecord(tx, stored, p, now)
				return err
			}
		}
		return kv.PutJSON(tx, terminationKey(t.ID), stored)
	})
}

// recordLeases writes the next page of the leases of the chunk the cursor
// names (Cursor.LeasesPending) as a record part of its own. Its members
// were terminated in the chunk's transaction: none gets a new lease
// (takesWork) or is taken over since, and finalising their leases again
// finds them as the chunk did (FinalizeHeldBy is idempotent); the page
// starts after the last lease written, so each is in the record once.
func (s *Supervisor) recordLeases(ctx context.Context, t Termination, now time.Time) error {
	cur := t.Cursor
	var ids []string
	if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		_, ids, err = ownedIn(tx, t, cur.LeasesFrom, cur.Entry-cur.LeasesFrom)
		return err
	}); err != nil {
		return err
	}
	var leases []RecordLease
	var fetched leasesRead
	var err error
	if len(ids) > 0 {
		afterJob, _, _ := strings.Cut(cur.LeasesAfter, "\x00")
		if leases, fetched, err = s.membersLeases(ctx, t, ids, afterJob); err != nil {
			return err
		}
	}
	return s.inChunk(ctx, t, nil, func(tx store.Txn, stored Termination) error {
		c := &stored.Cursor
		_, members, err := ownedIn(tx, stored, c.LeasesFrom, c.Entry-c.LeasesFrom)
		if err != nil {
			return err
		}
		_, leases := heldByOnly(members, nil, leases)
		page, more := leasePage(leases, c.LeasesAfter, s.pageBytes())
		more = more || fetched.more
		if len(page) > 0 {
			if c.Parts, err = putRecordParts(tx, c.RecordID, c.Parts, &ReconciliationRecord{Leases: page}); err != nil {
				return err
			}
		}
		if more {
			c.LeasesAfter = fetched.after(page)
		}
		if !more {
			c.LeasesPending, c.LeasesFrom, c.LeasesAfter = false, 0, ""
		}
		stored.UpdatedAt = now
		return kv.PutJSON(tx, terminationKey(t.ID), stored)
	})
}

// recordGrants writes the next page of the grants of the chunk the cursor
// names (Cursor.GrantsPending) as a record part of its own, as
// recordLeases writes its leases: the members were terminated in the
// chunk's transaction and are issued no grant since, so the held index (or,
// for a revocation begun without it, the holders' own index) lists what the
// chunk listed; the page starts after the last grant written.
func (s *Supervisor) recordGrants(ctx context.Context, t Termination, now time.Time) error {
	cur := t.Cursor
	var ids []string
	var held []heldItem
	if err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if _, ids, err = ownedIn(tx, t, cur.LeasesFrom, cur.Entry-cur.LeasesFrom); err != nil || !t.HeldIndexed {
			return err
		}
		held, err = readHeld(tx, t.ID, heldGrant, cur.LeasesFrom, cur.Entry)
		held = heldOf(held, setOf(ids))
		return err
	}); err != nil {
		return err
	}
	var grants []HeldGrant
	if len(ids) > 0 {
		var err error
		if grants, err = s.grantsHeld(ctx, t, held, ids); err != nil {
			return err
		}
	}
	return s.inChunk(ctx, t, nil, func(tx store.Txn, stored Termination) error {
		c := &stored.Cursor
		_, members, err := ownedIn(tx, stored, c.LeasesFrom, c.Entry-c.LeasesFrom)
		if err != nil {
			return err
		}
		grants, _ := heldByOnly(members, grants, nil)
		page, more := grantPage(grants, c.GrantsAfter, s.pageBytes())
		if len(page) > 0 {
			part := &ReconciliationRecord{Privileges: make([]RecordPrivilege, len(page))}
			for i, g := range page {
				part.Privileges[i] = grantPrivilege(g)
			}
			if c.Parts, err = putRecordParts(tx, c.RecordID, c.Parts, part); err != nil {
				return err
			}
			c.GrantsAfter = page[len(page)-1].GrantID
		}
		if !more {
			c.GrantsPending, c.GrantsAfter = false, ""
		}
		stored.UpdatedAt = now
		return kv.PutJSON(tx, terminationKey(t.ID), stored)
	})
}

// leaseFetch is how many leases membersLeases asks the lease module for
// at a time.
const leaseFetch = 256

// leasesRead says where a read of the members' leases stopped: more, the
// module holds leases of jobs after the last one read (last, its
// leaseKey).
type leasesRead struct {
	more bool
	last string
}

// after is where the next page starts, page being what this one wrote:
// after its last lease, or, when it wrote none (every lease read was
// another termination's), after the last one read.
func (r leasesRead) after(page []RecordLease) string {
	if len(page) > 0 {
		return leaseKey(page[len(page)-1])
	}
	return r.last
}

// membersLeases lists the leases the members ids held, of the jobs after
// afterJob in order of job id, about a page of them (pageBytes; the
// module is asked leaseFetch at a time), as the record lists them: handed
// over as they are during a rollout's handover, otherwise finalised for
// this termination (idempotent), each flagged when its end is its
// holder's claim under stop. Each page starts after the last lease
// written, so a chunk's leases are each read about once, not once per
// page.
func (s *Supervisor) membersLeases(ctx context.Context, t Termination, ids []string, afterJob string) ([]RecordLease, leasesRead, error) {
	var leases []RecordLease
	var read leasesRead
	bytes := 0
	for {
		var got []RecordLease
		var more bool
		var err error
		page := LeasePage{After: afterJob, Limit: leaseFetch, StopRequestedAt: t.RequestedAt}
		switch {
		case t.LeaseHandover && s.Handover != nil:
			if got, more, err = s.Handover.HeldBy(ctx, ids, page); err != nil {
				return nil, read, fmt.Errorf("list leases: %w", err)
			}
		case s.Leases != nil && !t.LeaseHandover:
			if got, more, err = s.Leases.FinalizeHeldBy(ctx, ids, t.finalReason(), page); err != nil {
				return nil, read, fmt.Errorf("finalize leases: %w", err)
			}
		}
		leases = append(leases, got...)
		read.more = more && len(got) > 0
		for _, l := range got {
			bytes += leaseBytes(l)
			if l.JobID > afterJob {
				afterJob = l.JobID
			}
			if k := leaseKey(l); k > read.last {
				read.last = k
			}
		}
		if !read.more || bytes > s.pageBytes() {
			break
		}
	}
	since := map[string]time.Time{}
	holderSince := func(holder string) time.Time {
		at, ok := since[holder]
		if !ok {
			at = s.holderStopSince(ctx, holder)
			since[holder] = at
		}
		return at
	}
	markClaimsUnderStop(leases, t.UnderStopSince(), holderSince, func(principal string) bool { return s.stoppedAgent(ctx, t, principal) })
	return leases, read, nil
}

// holderStopSince is when the node of a lease's holder first came under a
// stop (tree.Node.StopSince, kept through every take-over), on a read of
// its node; zero when unknown.
func (s *Supervisor) holderStopSince(ctx context.Context, holder string) time.Time {
	if s.Tree == nil {
		return time.Time{}
	}
	n, err := s.Tree.Get(ctx, holder)
	if err != nil {
		return time.Time{}
	}
	return n.StopSince
}

// stoppedAgent reports whether principal is an agent of t's subtree (a
// node that is one of t's roots or below one), on a read of its node; an
// unknown node is not.
func (s *Supervisor) stoppedAgent(ctx context.Context, t Termination, principal string) bool {
	nodeID, ok := strings.CutPrefix(principal, "agent:")
	if !ok || s.Tree == nil {
		return false
	}
	n, err := s.Tree.Get(ctx, nodeID)
	if err != nil {
		return false
	}
	for _, r := range append([]string{t.NodeID}, t.Roots...) {
		if n.NodeID == r || slices.Contains(n.Ancestors, r) {
			return true
		}
	}
	return false
}

// markClaimsUnderStop flags each lease whose end rests on its holder's
// word given at or after the termination was requested, or after the
// holder's node first came under a stop this termination took it over
// from (holderSince, tree.Node.StopSince, read only for a word given
// before the request): the holder was
// being stopped (or about to be), so its SUCCESS or FAILED is its own
// claim under stop, shown, not confirmed — and so is its acknowledgement
// of the cancel request, on which the termination's reconciliation ends
// the job CANCELLED (where a holder that said nothing reads UNRESOLVED).
// The times are the lease machine's judgements (the control plane's
// clock, as RequestedAt is), read from the lease and its evidence, not
// anything the holder sent; requestedAt is Termination.UnderStopSince,
// which on etcd is not later than the request on the lease leader's
// clock once the reconciler marked.
//
// An acknowledgement before the request is flagged too when the cancel it
// acknowledged was asked for by an agent of the stopped subtree
// (stoppedAgent, asked of CancelRequestedBy): the subtree's own word on
// both ends, whenever given — a rogue subtree that cancelled and
// acknowledged its own job beforehand, and worked on, had the termination
// end it CANCELLED without the flag (twenty-ninth pass).
func markClaimsUnderStop(leases []RecordLease, requestedAt time.Time, holderSince func(holder string) time.Time, stoppedAgent func(principal string) bool) {
	for i := range leases {
		l := &leases[i]
		underStop := func(at time.Time) bool {
			if !at.Before(requestedAt) {
				return true
			}
			since := holderSince(l.HolderIdentity)
			return !since.IsZero() && !at.Before(since)
		}
		reported := l.EndedBy == LeaseEndedByHolderReport && !l.EndedAt.IsZero() && underStop(l.EndedAt)
		acked := l.EndedBy == LeaseEndedByTermination && l.TerminalResult == LeaseResultCancelled && !l.CancelAckedAt.IsZero() &&
			(underStop(l.CancelAckedAt) || l.CancelRequestedBy != "" && stoppedAgent(l.CancelRequestedBy))
		l.ClaimedUnderStop = reported || acked
	}
}

// recordPart is the part of the record for one chunk of the index: its
// nodes (members judged, the others superseded or prior), the members'
// privileges (the listed grants first) and leases. Every grant of grants
// judges its holder's exit; listed (those of grants this part lists, the
// first page) are listed, and named on an unaccounted holder's entry.
// unaccounted counts the members nobody accounted for.
//
// aliveChild returns a child of a member the control plane sees alive
// (childrenRead.aliveChild), asked only of a member whose bare claim of
// its exit would be corroborated, which the child then is not.
func recordPart(tx store.Txn, t Termination, entries []subtreeEntry, nodes map[string]*tree.Node, grants, listed []HeldGrant, privs []privilege.Privilege, leases []RecordLease, aliveChild func(n *tree.Node) aliveBelow) (*ReconciliationRecord, int, error) {
	part := &ReconciliationRecord{Leases: leases}
	heldGrants := map[string][]string{}
	liveGrants := map[string][]string{}
	for _, g := range grants {
		if g.Outcome != privilege.OutcomeRevoked && g.Outcome != privilege.OutcomeExpired {
			liveGrants[g.NodeID] = append(liveGrants[g.NodeID], g.GrantID)
		}
	}
	for _, g := range listed {
		heldGrants[g.NodeID] = append(heldGrants[g.NodeID], g.GrantID)
		part.Privileges = append(part.Privileges, grantPrivilege(g))
	}
	heldJobs := map[string][]string{}
	for _, l := range leases {
		heldJobs[l.HolderIdentity] = append(heldJobs[l.HolderIdentity], l.JobID)
	}
	inWorkload := t.workloadIn(tx)
	// The calls this termination refused past those it lists, for every
	// node whose refusals it lists (its members', and those it refused
	// before another stop accounted for the node).
	counted := make([]*tree.Node, 0, len(entries))
	for _, e := range entries {
		counted = append(counted, nodes[e.Node])
	}
	refusedMore, err := ledger.RefusedNotListedOf(tx, t.ID, counted)
	if err != nil {
		return nil, 0, err
	}
	// The open calls of the members whose word would otherwise stand
	// (openCallOf), fetched together: on etcd one request per few hundred
	// members, not one each.
	var callScans [][]byte
	for _, e := range entries {
		n := nodes[e.Node]
		if e.member() && n.TerminationID == t.ID && n.Holds.May(tree.HoldsCalls) && tree.WeighedBeside(tree.JudgeExit(n, inWorkload, liveGrants[n.NodeID])) {
			callScans = append(callScans, ledger.OpenCallPrefix(n.NodeID))
		}
	}
	if err := store.Prefetch(tx, nil, callScans); err != nil {
		return nil, 0, err
	}
	unaccounted := 0
	for _, e := range entries {
		n := nodes[e.Node]
		switch {
		case e.member() && n.TerminationID == t.ID:
			var beside tree.Beside
			if tree.WeighedBeside(tree.JudgeExit(n, inWorkload, liveGrants[n.NodeID])) {
				if beside.OpenCall, err = openCallOf(tx, n); err != nil {
					return nil, 0, err
				}
				beside = aliveChild(n).beside(beside)
			}
			rn := recordNode(n, inWorkload, liveGrants[n.NodeID], heldGrants[n.NodeID], heldJobs[n.NodeID], beside)
			if e.Reach == ReachTakeOver {
				rn.InnerTerminationID = e.Other
				rn.InnerOutcome = InnerOutcomeTakenOverDraining
				if e.State == tree.StateName(tree.NodeStateAborting) {
					rn.InnerOutcome = InnerOutcomeTakenOverAborting
				}
			}
			if rn.Outcome == NodeOutcomeUnaccounted {
				unaccounted++
			}
			rn.RefusedCallsNotListed = refusedMore[n.NodeID]
			part.Nodes = append(part.Nodes, rn)
		case e.Reach == ReachPrior:
			rn := RecordNode{
				NodeID: n.NodeID, Name: n.Name, ParentNodeID: n.ParentNodeID, LastSeenAt: n.LastSeenAt,
				Outcome:            NodeOutcomeUnaccounted,
				InnerTerminationID: e.Other, InnerOutcome: InnerOutcomeTerminated, InnerRecordID: e.Record,
				RefusedCallsNotListed: refusedMore[n.NodeID],
			}
			if e.Record != "" {
				earlier, err := earlierOutcomes(tx, e.Record)
				if err != nil {
					return nil, 0, err
				}
				if pn, ok := earlier[n.NodeID]; ok {
					rn.Outcome, rn.ConfirmedBy, rn.ConfirmedAt = pn.Outcome, pn.ConfirmedBy, pn.ConfirmedAt
					rn = reweighPrior(rn, tree.JudgeExit(n, inWorkload, nil))
				}
			}
			part.Nodes = append(part.Nodes, rn)
		default:
			// Left to another termination at the mark, or taken over by
			// one since: the one the node names accounts for it.
			by := e.Other
			if e.member() {
				by = n.TerminationID
			}
			part.Nodes = append(part.Nodes, RecordNode{
				NodeID: n.NodeID, Name: n.Name, ParentNodeID: n.ParentNodeID, LastSeenAt: n.LastSeenAt,
				Outcome: NodeOutcomeSuperseded, SupersededByTerminationID: by,
				RefusedCallsNotListed: refusedMore[n.NodeID],
			})
		}
	}
	for _, p := range privs {
		part.Privileges = append(part.Privileges, registeredPrivilege(p))
	}
	return part, unaccounted, nil
}

// openCallOf reads a call of n still open (in flight, or its cancel not
// acknowledged), if any, for a member whose bare claim of its exit would
// be corroborated: its tool may still be at work for the node
// (tree.JudgeExitBeside). The record closes such calls
// cancel_unacknowledged after its nodes, so they are open here. One
// read of the node's open calls, only when it may have some.
func openCallOf(tx store.ReadTxn, n *tree.Node) (*tree.CallInFlight, error) {
	if !n.Holds.May(tree.HoldsCalls) {
		return nil, nil
	}
	c, err := ledger.FirstOpenCallIn(tx, n.NodeID)
	if err != nil || c == nil {
		return nil, err
	}
	return &tree.CallInFlight{CallID: c.CallID, Tool: c.Tool, GateID: c.GateID, BegunAt: c.BegunAt, NodeID: n.NodeID, ParentNodeID: n.ParentNodeID}, nil
}

// childrenAlive reads the descendants of parents (members whose bare
// claim of their exit the control plane would corroborate), each up to the
// first the control plane sees alive now (tree.ChildAlive), into c: a
// member was issued each child's credential at its spawn, and with it may
// spawn below the child and take each grandchild's credential (the Spawn's
// answer), and so on down; its bare claim is not corroborated while one is
// at work (tree.JudgeExitBeside). Until the thirty-first pass only the
// children were read, and a rogue that lived on as its grandchild read
// confirmed. In a read of its own, not the record's transaction: a member
// may have up to tree.Limits.MaxChildren children, each read a comparison
// at that transaction's commit on etcd, which a rogue parent with many
// children would take past the store's bound, its stop never recorded. A
// descendant whose session or stream ends between the two still weighs
// against its ancestors, the safe way.
func (s *Supervisor) childrenAlive(ctx context.Context, parents []string, c *childrenRead) error {
	found := map[string]aliveBelow{}
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		clear(found)
		below := map[string]aliveBelow{}
		for _, m := range parents {
			d, err := aliveBelowIn(tx, m, below)
			if err != nil {
				return err
			}
			found[m] = d
		}
		return nil
	})
	if err != nil {
		return err
	}
	for m, d := range found {
		c.read[m] = true
		if d.found() {
			c.alive[m] = d
		}
	}
	return nil
}

// aliveBelowIn reads parent's descendants, children first, a page of
// children at a time, up to the first the control plane sees alive
// (tree.ChildAlive), and returns it; failing that, a page's first child
// with a call still open (a call of a descendant is work done with a
// credential parent may hold, as a session of it is: thirty-second
// pass); or neither. below keeps what it found for each node it walked
// (neither: nothing at work below), so that a walk reads a node's subtree
// once however many of its ancestors ask. A node that never held a child
// (tree.HoldsChildren) is not scanned for children, nor one that never
// held a call (tree.HoldsCalls) for calls.
func aliveBelowIn(tx store.ReadTxn, parent string, below map[string]aliveBelow) (aliveBelow, error) {
	if d, ok := below[parent]; ok {
		return d, nil
	}
	prefix := tree.ChildPrefix(parent)
	var ids []string
	if err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		ids = append(ids, string(k[len(prefix):]))
		return nil
	}); err != nil {
		return aliveBelow{}, err
	}
	const page = 1024
	var parents []string
	for start := 0; start < len(ids); start += page {
		batch := ids[start:min(start+page, len(ids))]
		if err := store.Prefetch(tx, store.KeysOf(batch, tree.NodeKey), nil); err != nil {
			return aliveBelow{}, err
		}
		var callers []*tree.Node
		for _, id := range batch {
			c, err := tree.GetNodeIn(tx, id)
			if errors.Is(err, tree.ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return aliveBelow{}, err
			}
			if _, _, ok := tree.ChildAlive([]*tree.Node{c}); ok {
				below[parent] = aliveBelow{node: c}
				return below[parent], nil
			}
			if c.Holds.May(tree.HoldsChildren) {
				parents = append(parents, id)
			}
			if c.State != tree.NodeStateTerminated && c.Holds.May(tree.HoldsCalls) {
				callers = append(callers, c)
			}
		}
		if len(callers) == 0 {
			continue
		}
		prefixes := make([][]byte, len(callers))
		for i, c := range callers {
			prefixes[i] = ledger.OpenCallPrefix(c.NodeID)
		}
		if err := store.Prefetch(tx, nil, prefixes); err != nil {
			return aliveBelow{}, err
		}
		for _, c := range callers {
			call, err := openCallOf(tx, c)
			if err != nil {
				return aliveBelow{}, err
			}
			if call != nil {
				below[parent] = aliveBelow{call: call}
				return below[parent], nil
			}
		}
	}
	for _, id := range parents {
		d, err := aliveBelowIn(tx, id, below)
		if err != nil {
			return aliveBelow{}, err
		}
		if d.found() {
			below[parent] = d
			return d, nil
		}
	}
	below[parent] = aliveBelow{}
	return aliveBelow{}, nil
}

// membersPrivileges reads the privileges of a chunk's members (the n
// entries from sequence from): from the held index when the revocation
// listed them there, else node by node.
func membersPrivileges(tx store.ReadTxn, t Termination, from, n int, members []string) ([]privilege.Privilege, error) {
	if len(members) == 0 {
		return nil, nil
	}
	if !t.HeldIndexed {
		return privilege.PrivilegesIn(tx, members)
	}
	items, err := readHeld(tx, t.ID, heldPrivilege, from, from+n)
	if err != nil {
		return nil, err
	}
	items = heldOf(items, setOf(members))
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	return privilege.ByID(tx, ids)
}

// recordCalls writes the next chunk of the calls the termination had to
// account for (in call id order), and with the last one the header.
// Calls still waiting for a cancel ack are closed here as
// cancel_unacknowledged.
func (s *Supervisor) recordCalls(ctx context.Context, t Termination, start bool, p Progress, now time.Time) error {
	budget := s.chunkSize()
	var written *ReconciliationRecord
	var unaccounted int
	err := s.recordChunk(ctx, t, start, func(tx store.Txn, stored Termination) error {
		written = nil
		cur := &stored.Cursor
		ids, more, err := termCallsAfter(tx, t.ID, cur.After, budget)
		if err != nil {
			return err
		}
		calls, err := callsIn(tx, ids)
		if err != nil {
			return err
		}
		if err := putCallsPart(tx, &stored, calls, now, s.Ledger); err != nil {
			return err
		}
		stored.UpdatedAt = now
		if more {
			cur.After = ids[len(ids)-1]
			return kv.PutJSON(tx, terminationKey(t.ID), stored)
		}
		// The last calls: the header in the same transaction.
		cur.After, cur.CallsDone = "", true
		written, unaccounted, err = finishRecord(tx, stored, p, now)
		return err
	})
	s.recordWritten(t, written, unaccounted, err)
	return err
}

// callsIn reads the calls ids (prefetched by termCallsAfter).
func callsIn(tx store.ReadTxn, ids []string) ([]*ledger.ToolCall, error) {
	calls := make([]*ledger.ToolCall, len(ids))
	for i, cid := range ids {
		c, err := ledger.GetCallIn(tx, cid)
		if err != nil {
			return nil, err
		}
		calls[i] = c
	}
	return calls, nil
}

// putCallsPart writes calls as a part of the record, closing those still
// open as cancel_unacknowledged in the ledger.
func putCallsPart(tx store.Txn, stored *Termination, calls []*ledger.ToolCall, now time.Time, l *ledger.Ledger) error {
	part := &ReconciliationRecord{}
	// A call still open is closed as of the instant the termination
	// stopped waiting for its gate, not this pass's.
	closedAt := stored.StoppedWaitingAt()
	if closedAt.IsZero() {
		closedAt = now
	}
	// The open keys and their nodes' counts of the calls it closes
	// (ledger.CloseOpenIn), fetched together (etcd).
	var open [][]byte
	counted := map[string]bool{}
	for _, c := range calls {
		if c.State == ledger.CallStateEnded {
			continue
		}
		open = append(open, ledger.OpenCallKey(c.NodeID, c.CallID))
		if !counted[c.NodeID] {
			counted[c.NodeID] = true
			open = append(open, ledger.OpenCountKey(c.NodeID))
		}
	}
	if len(open) > 0 {
		if err := store.Prefetch(tx, open, nil); err != nil {
			return err
		}
	}
	for _, c := range calls {
		if err := ledger.ForgetEndedIn(tx, c); err != nil {
			return err
		}
		if err := closeUnacknowledged(tx, stored.ID, c, closedAt, l); err != nil {
			return err
		}
		part.ToolCalls = append(part.ToolCalls, recordCall(c))
	}
	if len(part.ToolCalls) == 0 {
		return nil
	}
	cur := &stored.Cursor
	var err error
	cur.Parts, err = putRecordParts(tx, cur.RecordID, cur.Parts, part)
	return err
}

// callBytes bounds what a call weighs in a record's transaction: its
// entry, and the call itself when the record closes it.
func callBytes(c *ledger.ToolCall) int {
	return 2*(len(c.CallID)+len(c.NodeID)+len(c.Tool)+len(c.GateID)+len(c.BegunBy)+len(c.EndedBy)+len(c.AcknowledgedBy)+len(c.Error)) + 256
}

// callsBesideLastChunk writes every call the termination accounts for in
// the transaction of the record's last chunk of nodes when they fit
// beside it — at most a chunk of calls, weighing at most a page, as the
// grants and the leases a chunk carries — and says whether it did (then
// the caller writes the header too: the record is one commit fewer).
func callsBesideLastChunk(tx store.Txn, stored *Termination, budget, page int, now time.Time, l *ledger.Ledger) (bool, error) {
	ids, more, err := termCallsAfter(tx, stored.ID, "", budget)
	if err != nil || more {
		return false, err
	}
	calls, err := callsIn(tx, ids)
	if err != nil {
		return false, err
	}
	size := 0
	for _, c := range calls {
		if size += callBytes(c); size > page {
			return false, nil
		}
	}
	if err := putCallsPart(tx, stored, calls, now, l); err != nil {
		return false, err
	}
	stored.Cursor.After, stored.Cursor.CallsDone = "", true
	return true, nil
}

// finishRecord writes the record's last part (what describes the whole
// termination) and its header, which makes it visible, and terminates the
// termination, in the transaction of the record's last part (the calls'
// last chunk, or a header alone where a version before that stopped
// between them).
func finishRecord(tx store.Txn, stored Termination, p Progress, now time.Time) (*ReconciliationRecord, int, error) {
	cur := stored.Cursor
	if _, err := tx.Get(recordByTermKey(stored.ID)); err == nil {
		return nil, 0, fmt.Errorf("supervisor: termination %s already has a record", stored.ID)
	}
	next, err := Advance(stored, ActWriteRecord, p, now)
	if err != nil {
		return nil, 0, err
	}
	rec, err := recordHeaderOf(tx, next, cur.RecordID, now)
	if err != nil {
		return nil, 0, err
	}
	parts, err := putRecordParts(tx, rec.RecordID, cur.Parts, rec)
	if err != nil {
		return nil, 0, err
	}
	if err := putRecordHeader(tx, rec.RecordID, stored.ID, parts, cur.Parts); err != nil {
		return nil, 0, err
	}
	if err := indexRecord(tx, rec.RecordID, stored); err != nil {
		return nil, 0, err
	}
	// The entry names the record's turn in the outbox (its termination's
	// group, as in the reconciler's loop).
	if err := tx.Put(outboxKey(rec.RecordID), []byte(treeGroup(stored.Tree, stored.RequesterLineage, stored.RequestedBy))); err != nil {
		return nil, 0, err
	}
	next.RecordID = rec.RecordID
	// The final progress is the record's: every node counted once.
	next.Progress.Unconfirmed = cur.Unaccounted
	next.Progress.HooksPending = 0
	return rec, cur.Unaccounted, kv.PutJSON(tx, terminationKey(stored.ID), next)
}

// recordWritten logs a record written (finishRecord's, committed).
func (s *Supervisor) recordWritten(t Termination, written *ReconciliationRecord, unaccounted int, err error) {
	if err == nil && written != nil {
		s.Log.Info("termination complete", "termination_id", t.ID, "record_id", written.RecordID, "nodes", t.Counts.Listed, "unaccounted", unaccounted)
	}
}

// heldByOnly keeps the grants and leases held by members.
func heldByOnly(members []string, grants []HeldGrant, leases []RecordLease) ([]HeldGrant, []RecordLease) {
	member := make(map[string]bool, len(members))
	for _, m := range members {
		member[m] = true
	}
	var g []HeldGrant
	for _, x := range grants {
		if member[x.NodeID] {
			g = append(g, x)
		}
	}
	var l []RecordLease
	for _, x := range leases {
		if member[x.HolderIdentity] {
			l = append(l, x)
		}
	}
	return g, l
}

// earlierOutcomes is the outcome an earlier record gave each of its nodes.
// Records never change once written, so the last one read is kept: the
// prior nodes of a chunk, and of the next chunks, mostly name one record.
func earlierOutcomes(tx store.ReadTxn, recordID string) (map[string]RecordNode, error) {
	earlier.mu.Lock()
	if earlier.id == recordID {
		defer earlier.mu.Unlock()
		return earlier.nodes, nil
	}
	earlier.mu.Unlock()
	prev, err := getRecord(tx, recordID)
	if err != nil {
		return nil, err
	}
	nodes := make(map[string]RecordNode, len(prev.Nodes))
	for _, pn := range prev.Nodes {
		nodes[pn.NodeID] = pn
	}
	earlier.mu.Lock()
	earlier.id, earlier.nodes = recordID, nodes
	earlier.mu.Unlock()
	return nodes, nil
}

var earlier struct {
	mu    sync.Mutex
	id    string
	nodes map[string]RecordNode
}

// putRecordParts appends part to a record's stored parts from number from
// (split under the store's value limit) and returns the next part number.
// A record is the concatenation of its parts' bytes: protobuf appends the
// repeated fields of concatenated messages, so a record written in parts
// reads as one.
func putRecordParts(tx store.Txn, recordID string, from int, part *ReconciliationRecord) (int, error) {
	b, err := encodeRecord(part)
	if err != nil {
		return from, err
	}
	n := from
	for off := 0; off < len(b) || n == from; off += recordPartBytes {
		end := min(off+recordPartBytes, len(b))
		if err := tx.Put(recordPartKey(recordID, n), b[off:end]); err != nil {
			return from, err
		}
		n++
	}
	return n, nil
}

// index moves a termination stored before the subtree index (its subtree
// listed in Members, TakenOver, HandedOver and Prior) to the index, in one
// transaction (its lists fitted in one value, so they fit in one
// transaction), so that every step after the mark has one form to handle.
func (s *Supervisor) index(ctx context.Context, id string) error {
	return s.Store.Update(ctx, func(tx store.Txn) error {
		var t Termination
		if err := getTermination(tx, id, &t); err != nil {
			return err
		}
		if t.Indexed || t.Phase == PhaseRequested || t.Phase == PhaseTerminated {
			return nil
		}
		taken := map[string]Handoff{}
		for _, h := range t.TakenOver {
			taken[h.NodeID] = h
		}
		var entries []subtreeEntry
		for _, m := range t.Members {
			e := subtreeEntry{Node: m, Reach: ReachMark}
			if h, ok := taken[m]; ok {
				e = subtreeEntry{Node: m, Reach: ReachTakeOver, Other: h.TerminationID, State: h.State}
			}
			entries = append(entries, e)
		}
		for _, h := range t.HandedOver {
			entries = append(entries, subtreeEntry{Node: h.NodeID, Reach: ReachLeave, Other: h.TerminationID})
		}
		for _, h := range t.Prior {
			entries = append(entries, subtreeEntry{Node: h.NodeID, Reach: ReachPrior, Other: h.TerminationID, Record: h.RecordID})
		}
		if err := putSubtreeEntries(tx, id, 0, entries); err != nil {
			return err
		}
		t.Counts = Counts{Listed: len(entries), Members: len(t.Members), TakenOver: len(t.TakenOver), HandedOver: len(t.HandedOver), Prior: len(t.Prior)}
		t.TookOverFrom, t.SupersededBy = handoffTerminations(t.TakenOver), handoffTerminations(t.HandedOver)
		t.Members, t.TakenOver, t.HandedOver, t.Prior = nil, nil, nil, nil
		t.Indexed = true
		return kv.PutJSON(tx, terminationKey(id), t)
	})
}

// chunkCounter counts the chunks of each step this process has committed
// (for Supervisor.ChunkFault).
type chunkCounter struct {
	mu sync.Mutex
	n  map[Action]int
}

// chunkDone tells ChunkFault that a chunk of step committed.
func (s *Supervisor) chunkDone(step Action) {
	if s.ChunkFault == nil {
		return
	}
	s.chunks.mu.Lock()
	if s.chunks.n == nil {
		s.chunks.n = map[Action]int{}
	}
	s.chunks.n[step]++
	n := s.chunks.n[step]
	s.chunks.mu.Unlock()
	name := map[Action]string{ActMark: "mark", ActEscalate: "escalate", ActCancelCalls: "cancel", ActRevoke: "revoke", ActWriteRecord: "record"}[step]
	if name != "" {
		s.ChunkFault(name, n)
	}
}

// putAdvanced writes the termination as Advance leaves it after action
// (the last chunk of a step, in that chunk's transaction).
func putAdvanced(tx store.Txn, t Termination, action Action, p Progress, now time.Time) error {
	_, err := putAdvancedAs(tx, t, action, p, now)
	return err
}

// putAdvancedAs is putAdvanced that returns the termination it wrote.
func putAdvancedAs(tx store.Txn, t Termination, action Action, p Progress, now time.Time) (Termination, error) {
	next, err := Advance(t, action, p, now)
	if err != nil {
		return next, err
	}
	return next, kv.PutJSON(tx, terminationKey(t.ID), next)
}

// keepAckDeadline tells the ledger the acknowledgement deadline t (as a
// step committed it) entered aborting with, so that the acknowledgements
// that follow are judged on it without reading the termination
// (ledger.Ledger.KeepAckDeadline).
func (s *Supervisor) keepAckDeadline(t Termination) {
	if s.Ledger != nil && t.Phase == PhaseAborting {
		s.Ledger.KeepAckDeadline(t.ID, t.CancelDeadline)
	}
}

// inChunk runs one chunk of t's current step in its own transaction, on
// the termination as stored; it does nothing when the stored termination
// has moved on from t: its cursor moved, or moved (when set) says so.
func (s *Supervisor) inChunk(ctx context.Context, t Termination, moved func(stored, t *Termination) bool, chunk func(tx store.Txn, stored Termination) error) error {
	return s.inChunkReading(ctx, t, moved, nil, nil, chunk)
}

// inChunkReading is inChunk asking the store for keys and scans with the
// termination, before its first read (store.PrefetchReads: one request on
// etcd, at the revision the transaction then reads at). They are what the
// chunk will read if the stored termination is t, as it is unless another
// step moved it meanwhile; a read the chunk then does not make costs a
// range and guards nothing, and what it reads is checked at the commit as
// any read.
func (s *Supervisor) inChunkReading(ctx context.Context, t Termination, moved func(stored, t *Termination) bool, keys [][]byte, scans []store.ScanFrom, chunk func(tx store.Txn, stored Termination) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error {
		if keys != nil || scans != nil {
			if err := store.PrefetchReads(tx, append([][]byte{terminationKey(t.ID)}, keys...), scans); err != nil {
				return err
			}
		}
		var stored Termination
		if err := getTermination(tx, t.ID, &stored); err != nil {
			return err
		}
		if stored.Cursor != t.Cursor || moved != nil && moved(&stored, &t) {
			return nil
		}
		return chunk(tx, stored)
	})
}

// phaseMoved: the termination left the phase the chunk was planned in.
func phaseMoved(stored, t *Termination) bool { return stored.Phase != t.Phase }

// notReconciling: the termination is neither reconciling nor superseded.
func notReconciling(stored, _ *Termination) bool {
	return stored.Phase != PhaseReconciling && !stored.Superseded()
}
