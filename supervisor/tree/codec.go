package tree

import "github.com/tetherhq/tether/internal/storecodec"

// A node's stored form is tether.v1.Node's protobuf encoding, written from
// Node's pb tags.

func encodeNode(n *Node) ([]byte, error) { return storecodec.Marshal(n) }

// MarshalNode is a node's stored form, as PutNodeIn writes it (the
// termination keeps the nodes its mark wrote, to check them at the
// record's commit instead of reading them).
func MarshalNode(n *Node) ([]byte, error) { return encodeNode(n) }

// UnmarshalNode decodes a node from its stored form (a value under
// NodePrefix), for the readers that follow the nodes with a watch or a
// scan of their own.
func UnmarshalNode(b []byte, n *Node) error { return storecodec.Unmarshal(b, n) }

// StoredState reads only the state of a stored node, a few times faster
// than decoding it whole: the metrics' census classifies every node write
// by its state.
func StoredState(b []byte) (NodeState, error) {
	var s struct {
		State NodeState `pb:"6"` // Node.State
	}
	err := storecodec.Unmarshal(b, &s)
	return s.State, err
}
