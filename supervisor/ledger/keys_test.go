package ledger

import "testing"

// TestKeyLayout pins the ledger's storage keys: data written by an earlier
// version must still load, so a key may never change. (The termination
// watches Prefix for every ledger change.)
func TestKeyLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Prefix, "calls/"},
		{string(CallKey("c_1")), "calls/call/c_1"},
		{string(OpenCallPrefix("n_1")), "calls/open/n_1/"},
		{string(OpenCallKey("n_1", "c_1")), "calls/open/n_1/c_1"},
		{string(OpenCountKey("n_1")), "calls/opencount/n_1"},
		{string(cancelPrefix("g")), "calls/cancel/g/"},
		{string(CancelKey("g", "c_1")), "calls/cancel/g/c_1"},
		{string(TermCallPrefix("t_1")), "calls/term/t_1/"},
		{string(TermCallKey("t_1", "c_1")), "calls/term/t_1/c_1"},
		{string(refusedPrefix("t_1", "n_1")), "calls/refused/t_1/n_1/"},
		{string(refusedKey("t_1", "n_1", "c_1")), "calls/refused/t_1/n_1/c_1"},
		{string(EndedOnPrefix("n_1")), "calls/endedon/n_1/"},
		{string(EndedOnKey("n_1", "c_1")), "calls/endedon/n_1/c_1"},
		{string(RefusedMoreKey("t_1", "n_1")), "calls/refusedmore/t_1/n_1"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
