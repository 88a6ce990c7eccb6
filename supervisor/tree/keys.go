package tree

// Store key layout of the agent tree. Keys are readable strings so that a
// person debugging a data directory can follow them.
const (
	prefixNode = "agents/node/" // agents/node/<node id> → Node
	// agents/child/<parent id>/<child id> → a child note (ChildMayHaveChildren):
	// whether the child may have children of its own ("" in entries written
	// before the notes: it may).
	prefixChild = "agents/child/"
	// agents/children/<parent id> → the parent's number of children (uint64,
	// big-endian), so a spawn checks the limit without counting them; a
	// parent without it (spawned before it existed) is counted once.
	prefixChildCount = "agents/children/"
	prefixSession    = "agents/session/" // agents/session/<instance>/<node id>/<session id> → "" while open
	// agents/stoprequested/<node id> → the id of a termination requested
	// on the node whose mark has not marked it yet (cover.go).
	prefixStopRequested = "agents/stoprequested/"
	// agents/root/<root id> → "": the roots, so that a listing of them
	// (ListLevel) reads them, not every node; written with each root, and
	// for a data directory written before it by IndexRoots at start, which
	// writes rootsIndexedKey last.
	prefixRoot      = "agents/root/"
	rootsIndexedKey = "agents/rootsindexed"
)

// NodePrefix is the prefix of every node's key, for the reconcilers that
// watch the tree (a node changed: its state, its confirmations).
const NodePrefix = prefixNode

func sessionKey(instance, node, session string) []byte {
	return []byte(prefixSession + instance + "/" + node + "/" + session)
}

func nodeKey(id string) []byte             { return []byte(prefixNode + id) }
func childPrefix(parent string) []byte     { return []byte(prefixChild + parent + "/") }
func childKey(parent, child string) []byte { return []byte(prefixChild + parent + "/" + child) }
func childCountKey(parent string) []byte   { return []byte(prefixChildCount + parent) }
func stopRequestedKey(node string) []byte  { return []byte(prefixStopRequested + node) }
func rootKey(id string) []byte             { return []byte(prefixRoot + id) }

// NodeKey is a node's key, for callers that prefetch nodes they then read
// with GetNodeIn.
func NodeKey(id string) []byte { return nodeKey(id) }

// StopRequestedKey is the key of a node's stop request (the termination
// requested and not yet marked at it), for callers that prefetch it
// before ClearStopRequestedIn.
func StopRequestedKey(node string) []byte { return stopRequestedKey(node) }

// ChildPrefix is the prefix under which a parent's children are listed
// (ChildKey(parent, child) for each), for callers that walk a subtree in
// bounded, resumable steps (the termination's mark).
func ChildPrefix(parent string) []byte { return childPrefix(parent) }

// ChildKey is the key listing child under parent.
func ChildKey(parent, child string) []byte { return childKey(parent, child) }

// ChildCountKey holds parent's number of children (uint64, big-endian).
func ChildCountKey(parent string) []byte { return childCountKey(parent) }

// Child notes: the value of a child's entry in its parent's list says
// whether the child may have children, so that a walk that lists a level
// (the termination's mark) reads the child lists only of the children
// that may have some, not the empty lists of the leaves. The spawn that
// creates a child writes its entry childNoteLeaf; the spawn of the
// child's first child, in the transaction that notes it on the child's
// node (HoldsChildren), rewrites it childNoteParent. An entry written
// before the notes holds an empty value and says nothing. Like the node's
// bits, a note means "may have", and is never cleared.
var (
	childNoteLeaf   = []byte{'l'}
	childNoteParent = []byte{'p'}
)

// ChildMayHaveChildren reports whether a child whose entry in its parent's
// list (ChildKey) holds note may have children of its own: false only for
// an entry that says the child had none when the entry was last written,
// which the spawn of its first child rewrites in its own transaction.
func ChildMayHaveChildren(note []byte) bool { return string(note) != string(childNoteLeaf) }
