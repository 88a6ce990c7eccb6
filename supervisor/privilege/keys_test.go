package privilege

import "testing"

// TestKeyLayout pins the privileges' storage keys: data written by an
// earlier version must still load, so a key may never change.
func TestKeyLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(privilegeKey("p_1")), "privileges/priv/p_1"},
		{string(nodePrivPrefix("n_1")), "privileges/node/n_1/"},
		{string(nodePrivKey("n_1", "p_1")), "privileges/node/n_1/p_1"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
