package tree

import "testing"

// TestKeyLayout pins the tree's storage keys: data written by an earlier
// version must still load, so a key may never change.
func TestKeyLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(nodeKey("n_1")), "agents/node/n_1"},
		{string(childPrefix("n_1")), "agents/child/n_1/"},
		{string(childKey("n_1", "n_2")), "agents/child/n_1/n_2"},
		{string(childCountKey("n_1")), "agents/children/n_1"},
		{string(sessionKey("i_1", "n_1", "s_1")), "agents/session/i_1/n_1/s_1"},
		{string(stopRequestedKey("n_1")), "agents/stoprequested/n_1"},
		{NodePrefix, "agents/node/"},
		{string(NodeKey("n_1")), "agents/node/n_1"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
