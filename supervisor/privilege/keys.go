package privilege

// Privilege keys.
const (
	prefixPrivilege = "privileges/priv/" // privileges/priv/<id> → Privilege (JSON)
	prefixNodePriv  = "privileges/node/" // privileges/node/<node id>/<id> → ""
)

func privilegeKey(id string) []byte        { return []byte(prefixPrivilege + id) }
func nodePrivPrefix(node string) []byte    { return []byte(prefixNodePriv + node + "/") }
func nodePrivKey(node, priv string) []byte { return []byte(prefixNodePriv + node + "/" + priv) }
