package id

import (
	"strings"
	"testing"
)

func TestCheckSaysWhichKindOfIDItWanted(t *testing.T) {
	if err := Check(Node, "node_id", New(Node)); err != nil {
		t.Fatalf("a fresh node id: %v", err)
	}
	for _, tc := range []struct{ kind, s, want string }{
		{Node, New(Grant), `node_id "g_`},
		{Node, "n_short", "is not a node id (n_ and 20 characters)"},
		{Grant, New(Node), "is not a grant id (g_ and 20 characters)"},
		{Node, "n_ABCDEFGHJKMNPQRSTVWX", "is not a node id"},
		{Node, "", "node_id is required"},
		{Node, "n", "is not a node id"},
	} {
		err := Check(tc.kind, "node_id", tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%q, %q) = %v; want an error containing %q", tc.kind, tc.s, err, tc.want)
		}
	}
}
