package supervisor

// Store key layout of the supervisor. Keys are readable strings so that a
// person debugging a data directory can follow them.
const (
	prefixNode  = "agents/node/"  // agents/node/<node id> → tetherv1.Node
	prefixChild = "agents/child/" // agents/child/<parent id>/<child id> → ""
)

func nodeKey(id string) []byte             { return []byte(prefixNode + id) }
func childPrefix(parent string) []byte     { return []byte(prefixChild + parent + "/") }
func childKey(parent, child string) []byte { return []byte(prefixChild + parent + "/" + child) }
