package tree

// Store key layout of the agent tree. Keys are readable strings so that a
// person debugging a data directory can follow them.
const (
	prefixNode  = "agents/node/"  // agents/node/<node id> → Node
	prefixChild = "agents/child/" // agents/child/<parent id>/<child id> → ""
	// agents/children/<parent id> → the parent's number of children (uint64,
	// big-endian), so a spawn checks the limit without counting them; a
	// parent without it (spawned before it existed) is counted once.
	prefixChildCount = "agents/children/"
	prefixSession    = "agents/session/" // agents/session/<instance>/<node id>/<session id> → "" while open
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

// NodeKey is a node's key, for callers that prefetch nodes they then read
// with GetNodeIn.
func NodeKey(id string) []byte { return nodeKey(id) }

// ChildPrefix is the prefix under which a parent's children are listed
// (ChildKey(parent, child) for each), for callers that walk a subtree in
// bounded, resumable steps (the termination's mark).
func ChildPrefix(parent string) []byte { return childPrefix(parent) }

// ChildKey is the key listing child under parent.
func ChildKey(parent, child string) []byte { return childKey(parent, child) }

// ChildCountKey holds parent's number of children (uint64, big-endian).
func ChildCountKey(parent string) []byte { return childCountKey(parent) }
