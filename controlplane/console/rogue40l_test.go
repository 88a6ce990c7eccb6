package console_test

import (
	"testing"
)

// TestRogue40LQuickFindByAPartFromAnIDsMiddleFindsThatNodeAlone: the
// thirty-ninth pass made a query shaped like the START of a node id (n_
// and some of its characters) find the nodes whose id begins with it
// alone. An operator who copied worker-2's id from a cut cell or a
// wrapped line has a part of it without its "n_" ("8f3k2…" from the
// middle), and a part from an id's middle still matched names and labels
// holding it: the rogue's child named after that part, and its child
// named "worker-2" labelled ref=<worker-2's id>, were hits beside the
// real worker-2. A query of at least six of the ids' characters that is a
// part of a shown node's id now finds the nodes whose id holds it, and no
// other.
func TestRogue40LQuickFindByAPartFromAnIDsMiddleFindsThatNodeAlone(t *testing.T) {
	quickFindByAPartOfAnID(t, "a part from its id's middle", func(id string) string { return id[4:16] })
}
